"""Content-hash cases: first hash, a big file, and re-hashing unchanged data.

kinetic 0.0.4's own ``Data.content_hash`` is the baseline (and must give the same
hash); for the big file the baseline is hashlib's single-core SHA-256 rate on bytes
already in memory, the most any file hash can reach.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import kinetic_ref
from table import Row, best

from airflow_provider_kinetic.core.data import Data, content_hash_of
from airflow_provider_kinetic.core.data.hashing import fastlstat
from airflow_provider_kinetic.core.data.hashing.statcache import RACY_NS

HERE = Path(__file__).resolve().parent


def make_tree(root: Path, n: int, size: int, per_dir: int = 1000) -> float:
    """``n`` files of ``size`` random bytes, ``per_dir`` to a directory (a sharded
    dataset); returns when the last was written (the stat cache ignores younger files)."""
    blob = os.urandom(size + n)
    for i in range(n):
        d = root / f"shard-{i // per_dir:03d}"
        if i % per_dir == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"part-{i:06d}.bin").write_bytes(blob[i : i + size])
    return time.time()


def make_big_file(path: Path, size: int) -> None:
    block = os.urandom(min(size, 64 << 20))
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)


def wait_until_not_racy(written_at: float) -> None:
    """Files younger than the racy window are (rightly) never cached: let them age."""
    left = written_at + RACY_NS / 1e9 + 0.2 - time.time()
    if left > 0:
        time.sleep(left)


def first_hash(tree: Path, n: int, repeat: int, tmp: Path) -> Row:
    """Interleaved, best of ``repeat``; ours writes a fresh stat cache every run."""
    kdata = kinetic_ref.load("data.data")
    runs = iter(range(10**6))
    t_base = t_ours = float("inf")
    for _ in range(repeat):
        t, h_base = best(lambda: kdata.Data(str(tree)).content_hash(), 1)
        t_base = min(t_base, t)
        cache = str(tmp / f"first-{next(runs)}")
        t, h_ours = best(lambda c=cache: content_hash_of(str(tree), stat_cache=c), 1)
        t_ours = min(t_ours, t)
        assert h_base == h_ours, "our content hash differs from kinetic 0.0.4's"
    return Row.timed(f"first hash, {n:,} files", "kinetic", t_base, t_ours, 1.3)


def hashlib_seconds(path: Path, repeat: int) -> tuple[float, float]:
    """Seconds hashlib needs for the file's bytes already in memory, in one buffer and
    (for the record) as one 1 MiB block repeated, which stays in the CPU cache."""
    data = path.read_bytes()
    in_memory = best(lambda: hashlib.sha256(data).digest(), repeat)[0]
    block = memoryview(data)[: 1 << 20]

    def cache_resident() -> None:
        h = hashlib.sha256()
        for _ in range(len(data) // len(block)):
            h.update(block)

    return in_memory, best(cache_resident, repeat)[0]


def big_file(path: Path, repeat: int) -> list[Row]:
    size = path.stat().st_size
    kdata = kinetic_ref.load("data.data")
    t_rate, t_hot = hashlib_seconds(path, repeat)
    t_ours, h_ours = best(lambda: content_hash_of(str(path), stat_cache=None), repeat)
    t_base, h_base = best(lambda: kdata.Data(str(path)).content_hash(), repeat)
    assert h_base == h_ours, "our content hash of the big file differs from kinetic's"
    label = (
        f"hash one {size / 2**30:g} GiB file"
        if size >= 2**30
        else f"hash one {size >> 20} MiB file"
    )
    rates = (
        f"hashlib on the bytes in memory {size / t_rate / 1e9:.2f} GB/s (on one cache-resident "
        f"1 MiB block {size / t_hot / 1e9:.2f} GB/s); "
        f"ours, from the file, {size / t_ours / 1e9:.2f} GB/s"
    )
    return [
        Row.timed(label, "hashlib, 1 core", t_rate, t_ours, 0.95, rates),
        Row.timed(label + " vs kinetic", "kinetic", t_base, t_ours, None),
    ]


def _child(side: str, path: Path, cache: Path, native: bool = True) -> dict:
    env = {**os.environ, "KINETIC_STATCACHE_DIR": str(cache)}
    env["KINETIC_NATIVE_LSTAT"] = "1" if native else "0"
    done = subprocess.run(
        [sys.executable, str(HERE / "child.py"), side, str(path)],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def rehash(tree: Path, n: int, repeat: int, tmp: Path) -> list[Row]:
    """Re-hashing unchanged data, as each DAG run does with a fresh ``Data``: from a
    new process (ours reads the persistent stat cache) and within one process."""
    cache = tmp / "rehash-cache"
    warm = content_hash_of(str(tree), stat_cache=str(cache))
    built = fastlstat.available()  # else "ours" is the Python path too, and says so
    base, ours, python, floor = [], [], [], []
    for _ in range(repeat):
        base.append(_child("kinetic", tree, cache))
        ours.append(_child("ours", tree, cache, native=built))
        python.append(_child("ours", tree, cache, native=False))
        floor.append(_child("lstat", tree, cache)["seconds"])
    assert {r["hash"] for r in base + ours + python} == {warm}, "re-hash results differ"
    read = max(r["files_read"] for r in ours + python)
    t_base = min(r["seconds"] for r in base)
    new_process = Row.timed(
        f"re-hash unchanged {n:,} files, new process", "kinetic",
        t_base, min(r["seconds"] for r in ours), 10.0,
        f"stat cache hit: {read} of {n:,} files read; the files compared with the "
        f"record {'by the native extension' if built else 'in Python (extension NOT built)'}; "
        f"a loop of os.lstat alone takes "
        f"{min(floor):.3f} s ({t_base / min(floor):.1f}x)",
    )  # fmt: skip
    fallback = Row.timed(
        f"re-hash unchanged {n:,} files, new process, Python path", "kinetic",
        t_base, min(r["seconds"] for r in python), None,
        "KINETIC_NATIVE_LSTAT=0: where the extension is not built",
    )  # fmt: skip
    kdata = kinetic_ref.load("data.data")
    t_base, _ = best(lambda: kdata.Data(str(tree)).content_hash(), repeat)
    saved = os.environ.get("KINETIC_STATCACHE_DIR")
    os.environ["KINETIC_STATCACHE_DIR"] = str(cache)  # Data uses the default cache
    try:
        t_ours, _ = best(lambda: Data(str(tree)).content_hash(), repeat)
    finally:
        if saved is None:
            os.environ.pop("KINETIC_STATCACHE_DIR", None)
        else:
            os.environ["KINETIC_STATCACHE_DIR"] = saved
    same = Row.timed(
        f"re-hash unchanged {n:,} files, same process", "kinetic", t_base, t_ours, None
    )
    return [new_process, fallback, same]
