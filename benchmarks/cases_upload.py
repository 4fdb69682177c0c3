"""Upload cases: the first upload of a small-file tree to the real fake-gcs-server.

Both sides run their whole data-cache upload (hash, marker lookup, every file, marker)
into a fresh bucket each run: kinetic 0.0.4's ``kinetic.utils.storage.upload_data``
and our ``datacache.upload_data`` on a ``GcsStore``.  A far-away bucket is modelled by
``latency_proxy.py`` between the clients and the emulator (loopback only; it stops
when this process closes its stdin).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import kinetic_ref
from table import Row

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROJECT = "bench"


@contextlib.contextmanager
def fake_gcs(on_disk: bool = False) -> Iterator[str | None]:
    """The emulator's endpoint for the duration, or None when it is not installed
    (``on_disk``: objects in files under the temp dir rather than in its memory)."""
    sys.path.insert(0, str(REPO))
    from tests.fixtures.fake_gcs import _start, _stop, find_fake_gcs_binary

    binary = find_fake_gcs_binary()
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-gcs-") as tmp:
        root = os.path.join(tmp, "objects") if on_disk else None
        proc, endpoint = _start(binary, os.path.join(tmp, "server.log"), root)
        try:
            yield endpoint
        finally:
            _stop(proc)


@contextlib.contextmanager
def latency_proxy(endpoint: str, rtt_ms: float, mbps: float = 0.0) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` forwarding to ``endpoint`` with ``rtt_ms`` added (and
    each connection capped at ``mbps`` MB/s when given)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "latency_proxy.py"), "--upstream",
         endpoint.removeprefix("http://"), "--rtt-ms", str(rtt_ms), "--mbps", str(mbps)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError("the latency proxy did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the proxy's signal to stop
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _client(endpoint: str):  # type: ignore[no-untyped-def]
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


def _compare(endpoint: str, admin_endpoint: str, tree: Path, repeat: int) -> tuple[float, float]:
    """Best-of-``repeat`` seconds for kinetic and ours, interleaved, fresh buckets."""
    import time

    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    kstorage = kinetic_ref.load("utils.storage")
    kdata = kinetic_ref.load("data.data")
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    try:
        admin = _client(admin_endpoint)
        # kinetic caches one plain client per project; seed it (no ADC here).
        kstorage._cached_clients[PROJECT] = _client(endpoint)
        ours_client = _client(endpoint)
        t_base = t_ours = float("inf")
        for run in range(repeat):
            names = (f"k-{os.getpid()}-{run}-{time.monotonic_ns()}",
                     f"o-{os.getpid()}-{run}-{time.monotonic_ns()}")  # fmt: skip
            for name in names:
                admin.create_bucket(name)
            start = time.perf_counter()
            kstorage.upload_data(names[0], kdata.Data(str(tree)), project=PROJECT)
            t_base = min(t_base, time.perf_counter() - start)
            start = time.perf_counter()
            store = GcsStore(names[1], client=ours_client)
            store.data_layout = "kinetic"  # the same objects as kinetic's: the same work
            uploaded = datacache.upload_data(store, Data(str(tree)))
            t_ours = min(t_ours, time.perf_counter() - start)
            assert uploaded, "our upload was a cache hit in a fresh bucket"
            theirs = sorted(b.name for b in admin.list_blobs(names[0]))
            assert theirs == sorted(b.name for b in admin.list_blobs(names[1])), "layouts differ"
        return t_base, t_ours
    finally:
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


def upload(tree: Path, n: int, repeat: int, rtt_ms: float) -> list[Row]:
    far = f"upload {n:,} small files, {rtt_ms:g} ms RTT"
    near = f"upload {n:,} small files, no added latency"
    with fake_gcs() as endpoint:
        if endpoint is None:
            return [Row.skipped(far, "no fake-gcs-server"), Row.skipped(near, "no fake-gcs-server")]
        with latency_proxy(endpoint, rtt_ms) as proxied:
            t_base, t_ours = _compare(proxied, endpoint, tree, repeat)
        rows = [Row.timed(far, "kinetic", t_base, t_ours, 2.0, "latency proxy on 127.0.0.1")]
        t_base, t_ours = _compare(endpoint, endpoint, tree, repeat)
        rows.append(Row.timed(near, "kinetic", t_base, t_ours, 0.95, "no regression: >= 0.95x"))
    return rows
