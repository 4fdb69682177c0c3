"""Transfer cases: what a pod waits on before its function starts, and the upload of
one big file, against kinetic 0.0.4's own code on the same fake-gcs-server.

- runner download: kinetic's ``remote_runner._download_data`` (what kinetic's pod runs
  for a Data ref) against our ``download_from_store`` (the runner's: parallel, sliced,
  every file checked, the cache entry's content hash recomputed, renamed into place),
  for a tree of many 1 MiB files and for one big file, both from the data cache;
- upload: kinetic's ``kinetic.utils.storage.upload_data`` against our
  ``datacache.upload_data`` for one big file into a fresh bucket (hash, marker
  lookup, the file, marker; our stat cache is off, so both hash every byte).

A far-away bucket is ``latency_proxy.py``: a round trip added per request and each
connection capped (``--mbps``), as one stream to a real bucket is limited while
parallel streams add up.  The same cases without the proxy are printed as info rows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cases_hash
import kinetic_ref
from cases_upload import PROJECT, _client, fake_gcs, latency_proxy
from table import Row

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data.refs import cache_key, make_data_ref
from airflow_provider_kinetic.core.data.schemes.download import download_from_store
from airflow_provider_kinetic.core.storage.gcs import GcsStore


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _downloads(endpoint: str, ref: dict, out: Path, repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` seconds for kinetic's runner download and ours, interleaved
    by case; both trees are compared with each other once."""
    runner = kinetic_ref.load("runner.remote_runner")
    theirs, ours = out / "kinetic", out / "ours"
    with _env(STORAGE_EMULATOR_HOST=endpoint):
        client = _client(endpoint)
        t_base = t_ours = float("inf")
        for _ in range(repeat):
            t_base = min(t_base, _seconds(lambda: runner._download_data(ref, str(theirs), client)))
            t_ours = min(t_ours, _seconds(lambda: download_from_store(ref, str(ours))))
            same = _listing(theirs) == _listing(ours)
            shutil.rmtree(theirs)
            shutil.rmtree(ours)
            assert same, "the two downloads differ"
    return t_base, t_ours


def _listing(root: Path) -> list[tuple[str, int]]:
    return sorted((p.relative_to(root).as_posix(), p.stat().st_size) for p in root.rglob("*"))


def _uploads(endpoint: str, admin_endpoint: str, big: Path, repeat: int) -> tuple[float, float]:
    kstorage = kinetic_ref.load("utils.storage")
    kdata = kinetic_ref.load("data.data")
    with _env(STORAGE_EMULATOR_HOST=endpoint, KINETIC_STATCACHE_DIR="off"):
        admin = _client(admin_endpoint)
        kstorage._cached_clients[PROJECT] = _client(endpoint)
        ours_client = _client(endpoint)
        t_base = t_ours = float("inf")
        for run in range(repeat):
            names = [f"{side}-{os.getpid()}-{run}-{time.monotonic_ns()}" for side in "ko"]
            for name in names:
                admin.create_bucket(name)
            start = time.perf_counter()
            kstorage.upload_data(names[0], kdata.Data(str(big)), project=PROJECT)
            t_base = min(t_base, time.perf_counter() - start)
            start = time.perf_counter()
            ours_store = GcsStore(names[1], client=ours_client)
            ours_store.data_layout = "kinetic"  # kinetic's objects: the same work
            assert datacache.upload_data(ours_store, Data(str(big)))
            t_ours = min(t_ours, time.perf_counter() - start)
            layouts = [
                sorted((b.name, b.size, b.crc32c) for b in admin.list_blobs(n)) for n in names
            ]
            assert layouts[0] == layouts[1], "the two uploads differ"
            for name in names:
                for blob in admin.list_blobs(name):
                    blob.delete()
    return t_base, t_ours


#: The rows, by key: ``--transfer-rows`` picks some (the big file's take minutes).
ROWS = ("many", "big", "up")


def transfer(
    tmp: Path,
    n: int,
    big_bytes: int,
    repeat: int,
    rtt_ms: float,
    mbps: float,
    rows_wanted: list[str] | None = None,
) -> list[Row]:
    size = f"{big_bytes / (1 << 30):g} GiB" if big_bytes >= 1 << 30 else f"{big_bytes >> 20} MiB"
    link = f"{rtt_ms:g} ms RTT, {mbps:g} MB/s per connection"
    names = {
        "many": f"runner download {n:,} x 1 MiB files",
        "big": f"runner download one {size} file",
        "up": f"upload one {size} file",
    }
    names = {k: v for k, v in names.items() if k in (rows_wanted or ROWS)}
    downloads = [k for k in ("many", "big") if k in names]
    with fake_gcs(on_disk=big_bytes > 1 << 30 and names.keys() != {"many"}) as endpoint:
        if endpoint is None:
            return [Row.skipped(f"{c}, {link}", "no fake-gcs-server") for c in names.values()]
        tree, big = tmp / "transfer-tree", tmp / "transfer-big.bin"
        cases_hash.make_tree(tree, n if "many" in names else 0, 1 << 20, per_dir=500)
        cases_hash.make_big_file(big, big_bytes if names.keys() - {"many"} else 0)
        bucket = f"transfer-{os.getpid()}"
        _client(endpoint).create_bucket(bucket)
        store = GcsStore(bucket, client=_client(endpoint))
        store.data_layout = "kinetic"  # kinetic's runner reads these refs too
        refs = {}
        with _env(KINETIC_STATCACHE_DIR="off"):
            for key, path in (("many", tree), ("big", big)):
                if key not in downloads:
                    continue
                data = Data(str(path))
                datacache.upload_data(store, data)
                refs[key] = make_data_ref(store.uri(cache_key(data.content_hash())), data.is_dir)
        shutil.rmtree(tree, ignore_errors=True)  # absent when its rows are not run
        out = tmp / "transfer-out"
        rows: list[Row] = []
        goals = {"many": 2.0, "big": 2.0, "up": 1.5}
        note = (
            f"latency proxy on 127.0.0.1: {link} (one stream is capped, parallel streams "
            "add up; one run each); ours verifies every file (CRC32C) and the content hash"
        )
        timings: dict[str, tuple[float, float]] = {}
        direct: dict[str, tuple[float, float]] = {}
        # Through the capped link a run takes minutes and its time is set by the cap,
        # not by noise: one run each (the direct info rows keep best-of-``repeat``).
        with latency_proxy(endpoint, rtt_ms, mbps) as proxied:
            for key in downloads:
                timings[key] = _downloads(proxied, refs[key], out, 1)
        for key in downloads:
            direct[key] = _downloads(endpoint, refs[key], out, repeat)
        for blob in _client(endpoint).list_blobs(bucket):  # the emulator holds it in memory
            blob.delete()
        if "up" in names:
            with latency_proxy(endpoint, rtt_ms, mbps) as proxied:
                timings["up"] = _uploads(proxied, endpoint, big, 1)
            direct["up"] = _uploads(endpoint, endpoint, big, repeat)
        for key, case in names.items():
            rows.append(Row.timed(f"{case}, {link}", "kinetic", *timings[key], goals[key], note))
        straight = "loopback straight to the emulator (what this machine moves in all)"
        for key, case in names.items():
            case = f"{case}, no added latency or cap"
            rows.append(Row.timed(case, "kinetic", *direct[key], None, straight))
        big.unlink()
    return rows
