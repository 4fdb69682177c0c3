"""Incremental Data cases (issue 41): what one changed file costs, and a local sweep's Data.

1. ``incremental``: a tree of N files (2,000 x 100 KiB, ~195 MiB) is uploaded to the
   real fake-gcs-server (objects on disk), one file gets 15 bytes appended, and the
   tree is uploaded again.  Bytes are counted at the store: what each side writes for
   the second upload (ours: every object written; kinetic 0.0.4: the bucket's growth,
   a full new entry) and how much the bucket grows.  Goal: ours sends and grows by at
   most the changed file plus the manifest.
2. ``sweep``: a sweep of 8 children on the local backend over a 200 MB Data tree.  Each
   child returns the seconds from its runner process's start to the function call;
   the same sweep with a plain string instead of the Data gives the same figure
   without Data, so the difference of the medians is what a child spends on its Data.
   Baseline: what a child paid before (a verified copy of the entry, the runner's
   download from a local store), measured here in the same run.  Goal: <= 0.2 s.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import kinetic_ref
from cases_upload import PROJECT, _client, fake_gcs
from table import Row

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data.refs import cache_key, make_data_ref
from tests.fixtures.stores import Counting

CHILDREN = 8


def make_tree(root: Path, n: int, size: int) -> Path:
    for i in range(n):
        path = root / f"part{i // 250:02d}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return root / "part00" / "f00000.bin"


def _bucket_bytes(admin: Any, name: str) -> int:
    return sum(b.size or 0 for b in admin.list_blobs(name))


def incremental(tmp: Path, n: int, size: int) -> list[Row]:
    case = f"re-upload {n:,} files ({n * size / 2**20:.0f} MiB) after one file changed"
    with fake_gcs(on_disk=True) as endpoint:
        if endpoint is None:
            return [Row.skipped(case, "no fake-gcs-server")]
        from airflow_provider_kinetic.core.storage.gcs import GcsStore

        tree = tmp / "incremental"
        changed = make_tree(tree, n, size)
        kstorage = kinetic_ref.load("utils.storage")
        kdata = kinetic_ref.load("data.data")
        saved = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = endpoint
        try:
            admin = _client(endpoint)
            kstorage._cached_clients[PROJECT] = _client(endpoint)
            theirs, ours_name = f"k-inc-{os.getpid()}", f"o-inc-{os.getpid()}"
            admin.create_bucket(theirs)
            admin.create_bucket(ours_name)
            store = Counting(GcsStore(ours_name, client=_client(endpoint)))
            kstorage.upload_data(theirs, kdata.Data(str(tree)), project=PROJECT)
            datacache.upload_data(store, Data(str(tree)))
            first_sent = sum(store.writes.values())
            with open(changed, "ab") as f:
                f.write(b"15 more bytes!!")
            k_before, o_before = _bucket_bytes(admin, theirs), _bucket_bytes(admin, ours_name)
            start = time.perf_counter()
            kstorage.upload_data(theirs, kdata.Data(str(tree)), project=PROJECT)
            t_base = time.perf_counter() - start
            store.writes.clear()
            start = time.perf_counter()
            assert datacache.upload_data(store, Data(str(tree)))
            t_ours = time.perf_counter() - start
            k_grew = _bucket_bytes(admin, theirs) - k_before
            o_grew = _bucket_bytes(admin, ours_name) - o_before
            data_sent = sum(v for k, v in store.writes.items() if not k.endswith(".claim"))
            claim = sum(v for k, v in store.writes.items() if k.endswith(".claim"))
            manifest = max(v for k, v in store.writes.items() if k.endswith(".json"))
        finally:
            if saved is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved
    limit = changed.stat().st_size + manifest
    return [
        Row(
            case + ": bytes sent",
            f"kinetic {k_grew:,} B ({t_base:.2f} s)",
            f"{data_sent:,} B ({t_ours:.2f} s)",
            k_grew / data_sent if data_sent else None,
            f"<= changed file + manifest ({limit:,} B)",
            data_sent <= limit,
            f"{len([k for k in store.writes if 'data-files' in k])} file object(s) and the "
            f"manifest ({manifest:,} B); plus a {claim} B upload claim, deleted after; "
            f"first upload {first_sent / 2**20:.1f} MiB",
        ),
        Row(
            case + ": store growth",
            f"kinetic {k_grew:,} B",
            f"{o_grew:,} B",
            k_grew / o_grew if o_grew else None,
            f"<= changed file + manifest ({limit:,} B)",
            o_grew <= limit,
            "bucket size after minus before, listed at the store",
        ),
    ]


def pre_call_s(x: int, table: Any = None) -> float:
    """The child: seconds from its process's start to this call (Linux /proc)."""
    import os
    import time

    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return time.time() - (btime + start_ticks / os.sysconf("SC_CLK_TCK"))


def _sweep(root: Path, table: Any) -> list[float]:
    from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
    from airflow_provider_kinetic.core.batch import launch as batchlaunch
    from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
    from airflow_provider_kinetic.core.batch import run as batchrun
    from airflow_provider_kinetic.core.batch.plan import plan_batch
    from airflow_provider_kinetic.core.config import KineticConfig
    from airflow_provider_kinetic.core.jobs.request import JobRequest

    config = KineticConfig(backend="local", root=str(root))
    store, backend = config.store(), LocalBackend(str(root))
    state, objects, local = plan_batch(
        JobRequest(func=pre_call_s, kwargs={"table": table}), list(range(CHILDREN)), "single",
        store, config=config, max_concurrent=CHILDREN, retries=0, fail_fast=False,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    deadline = time.monotonic() + 900
    while not batchrun.is_finished(state):
        batchlaunch.launch(state, config, backend, store)
        if time.monotonic() > deadline:
            raise TimeoutError(f"sweep did not finish: {batchrun.counts(state)}")
        time.sleep(0.05)  # the poll interval of this driver loop
        reports = backend.batch_status(state.group_id, list(state.active.values()))
        batchrun.observe(state, reports, backend, store)
    values, failures = batchoutcomes.gather(state, store)
    if failures:
        raise RuntimeError(f"sweep children failed: {failures}")
    return [float(v) for v in values]


def sweep(tmp: Path, n: int, size: int) -> list[Row]:
    from airflow_provider_kinetic.core.data.schemes.download import download_from_store

    case = f"local sweep of {CHILDREN} over {n * size / 1e6:.0f} MB Data: per child on Data"
    tree = tmp / "sweep-tree"
    make_tree(tree, n, size)
    root = tmp / "sweep-root"
    data = Data(str(tree))
    datacache.upload_data(_store(root), data)  # uploaded before both sweeps
    with_data = _sweep(root, data)
    without = _sweep(root, str(tree))
    per_child = statistics.median(with_data) - statistics.median(without)
    # Before: each child copied and verified the entry (the runner's download).
    uri = _store(root).uri(cache_key(data.content_hash()))
    copies = []
    for i in range(2):
        start = time.perf_counter()
        download_from_store(make_data_ref(uri, True), str(tmp / f"copy{i}"))
        copies.append(time.perf_counter() - start)
    before = min(copies)
    return [
        Row(
            case,
            f"a copy per child {before:.3f} s",
            f"{max(per_child, 0.0):.3f} s",
            before / per_child if per_child > 0 else None,
            "<= 0.2 s per child",
            per_child <= 0.2,
            f"median start-to-call {statistics.median(with_data):.3f} s with the Data, "
            f"{statistics.median(without):.3f} s without; {CHILDREN} at once",
        )
    ]


def _store(root: Path) -> Any:
    from airflow_provider_kinetic.core.config import KineticConfig

    return KineticConfig(backend="local", root=str(root)).store()
