"""Speed checks, each a ratio against a baseline measured in the same run.

    .venv/bin/python benchmarks/run.py [--files N]

1. content hash: our parallel hash vs the same algorithm run sequentially
   (kinetic 0.0.4's hash for <=16 files); results must be equal.
2. upload to the real fake-gcs-server: GcsStore.upload_files (transfer_manager,
   threads) vs one blob.upload_from_filename after another.
3. data cache: a second submit of the same Data (marker hit) vs the first upload.
A ratio > 1 means ours is faster.  Timings are best of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_kinetic.core import data as data_mod  # noqa: E402
from airflow_provider_kinetic.core.data import Data, content_hash_of  # noqa: E402


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), value


def line(what: str, base: str, t_base: float, ours: str, t_ours: float, note: str) -> str:
    return (
        f"{what:<16} {base} {t_base:7.3f}s  {ours} {t_ours:7.3f}s  "
        f"ratio {t_base / t_ours:5.2f}x  ({note})"
    )


def make_tree(root: Path, n: int, size: int) -> None:
    blob = os.urandom(size)
    for i in range(n):
        d = root / f"shard-{i % 20:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"part-{i:05d}.bin").write_bytes(blob[: size - (i % 7)])


def bench_hash(tree: Path, repeat: int) -> str:
    def sequential() -> str:
        saved = data_mod._PARALLEL_THRESHOLD
        data_mod._PARALLEL_THRESHOLD = 10**12
        try:
            return content_hash_of(str(tree))
        finally:
            data_mod._PARALLEL_THRESHOLD = saved

    t_base, h_base = best(sequential, repeat)
    t_ours, h_ours = best(lambda: content_hash_of(str(tree)), repeat)
    assert h_base == h_ours, "parallel hash differs from the sequential one"
    return line(
        "content hash",
        "baseline",
        t_base,
        "ours",
        t_ours,
        "sequential vs ours: threads when > 16 files and > 32 MiB",
    )


def bench_gcs(tree: Path, repeat: int) -> list[str]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from airflow_provider_kinetic.core import datacache
    from airflow_provider_kinetic.core.storage import GcsStore
    from tests.fixtures.fake_gcs import _start, _stop, find_fake_gcs_binary

    binary = find_fake_gcs_binary()
    if binary is None:
        return ["gcs upload       skipped: no fake-gcs-server binary"]
    with tempfile.TemporaryDirectory() as tmp:
        proc, endpoint = _start(binary, os.path.join(tmp, "server.log"))
        os.environ["STORAGE_EMULATOR_HOST"] = endpoint
        try:
            client = storage.Client(project="bench", credentials=AnonymousCredentials())
            files = sorted(p for p in tree.rglob("*") if p.is_file())
            rels = [str(p.relative_to(tree)) for p in files]
            runs = iter(range(10**6))

            def baseline() -> None:
                bucket = client.create_bucket(f"base-{next(runs)}")
                for path, rel in zip(files, rels, strict=True):
                    bucket.blob(f"x/{rel}").upload_from_filename(str(path))

            def ours() -> None:
                name = f"ours-{next(runs)}"
                client.create_bucket(name)
                GcsStore(name, client=client).upload_files(str(tree), rels, "x")

            t_base, _ = best(baseline, repeat)
            t_ours, _ = best(ours, repeat)
            client.create_bucket("cache")
            store = GcsStore("cache", client=client)
            t_miss, _ = best(lambda: datacache.upload_data(store, Data(str(tree))), 1)
            t_hit, uploaded = best(lambda: datacache.upload_data(store, Data(str(tree))), repeat)
            assert uploaded is False, "second upload of the same data was not a cache hit"
        finally:
            _stop(proc)
    return [
        line(
            "gcs upload",
            "baseline",
            t_base,
            "ours",
            t_ours,
            f"{len(files)} files, one upload_from_filename after another vs transfer_manager",
        ),
        line(
            "data cache hit",
            "miss",
            t_miss,
            "hit",
            t_hit,
            "hit = hash + one marker lookup, nothing uploaded",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--size", type=int, default=16 * 1024)
    parser.add_argument("--repeat", type=int, default=3)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "data"
        make_tree(tree, ns.files, ns.size)
        print(f"tree: {ns.files} files x ~{ns.size // 1024} KiB, {os.cpu_count()} CPUs")
        print(bench_hash(tree, ns.repeat))
        for line in bench_gcs(tree, ns.repeat):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
