"""A local job reads its Data through links to the verified, read-only cache entry: no
per-job copy, the children of a sweep read the same inodes, and a job that writes to a
Data file cannot change the cached bytes (root included: a read-only mount of its own)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.jobs.request import JobRequest
from tests.fixtures.batch_drive import drive
from tests.fixtures.local_jobs import run

TRUE_BYTES = b"the cached bytes"


def try_to_write(path: str) -> dict[str, Any]:
    """The job: write into its Data file every way a careless function would."""
    target = os.path.join(path, "a.txt")
    tries = {}
    for name, write in {
        "open": lambda: open(target, "r+b").write(b"XX"),  # noqa: SIM115
        "append": lambda: open(target, "ab").write(b"more"),  # noqa: SIM115
        "chmod": lambda: os.chmod(target, 0o644),
    }.items():
        try:
            write()
            tries[name] = "written"
        except OSError as exc:
            tries[name] = type(exc).__name__
    with open(target, "rb") as f:
        seen = f.read()
    try:  # nor add a name to the cached tree
        with open(os.path.join(path, "scratch.txt"), "w") as f:
            f.write("mine")
        tries["create"] = "written"
    except OSError as exc:
        tries["create"] = type(exc).__name__
    return {"tries": tries, "seen": seen, "ino": os.stat(target).st_ino}


def inode_of(x: int, table: str) -> tuple[int, int]:
    return x, os.stat(os.path.join(table, "a.txt")).st_ino


def test_a_job_cannot_change_the_cached_bytes_it_reads(
    config: KineticConfig,
    backend: LocalBackend,
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(TRUE_BYTES)
    data = Data(str(src))
    out = run(config, backend, JobRequest(func=try_to_write, args=(data,)))
    assert set(out["tries"].values()) <= {"PermissionError", "OSError"}, out["tries"]
    assert out["seen"] == TRUE_BYTES
    entry = Path(config.bucket_name, cache_key(data.content_hash()))
    assert (entry / "a.txt").read_bytes() == TRUE_BYTES
    assert out["ino"] == (entry / "a.txt").stat().st_ino  # the entry's own file: no copy
    assert sorted(os.listdir(entry)) == ["a.txt"]  # nothing was added to the entry
    again = run(config, backend, JobRequest(func=try_to_write, args=(data,)))
    assert again["seen"] == TRUE_BYTES  # the next job sees the true bytes, unchanged
    # With an empty directory (which the entry does not keep) the job gets a tree of
    # its own, of links to the entry's files: new names are its own, the bytes are not.
    (src / "empty").mkdir()
    linked = run(config, backend, JobRequest(func=try_to_write, args=(Data(str(src)),)))
    assert linked["tries"]["create"] == "written" and linked["seen"] == TRUE_BYTES
    assert {k: v for k, v in linked["tries"].items() if k != "create"} == {
        k: v for k, v in out["tries"].items() if k != "create"
    }
    assert linked["ino"] == (entry / "a.txt").stat().st_ino
    assert (entry / "a.txt").read_bytes() == TRUE_BYTES
    assert sorted(os.listdir(entry)) == ["a.txt"]


def test_a_sweeps_children_read_the_same_bytes_not_copies(
    config: KineticConfig,
    backend: LocalBackend,
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    table.mkdir()
    (table / "a.txt").write_bytes(TRUE_BYTES)
    (table / "b.txt").write_bytes(b"b")
    store = config.store()
    data = Data(str(table))
    request = JobRequest(func=inode_of, kwargs={"table": data})
    state, objects, local = plan_batch(
        request, [0, 1, 2], "single", store, config=config, max_concurrent=3, retries=0,
        fail_fast=False,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    drive(state, config, backend, store)
    values, failures = batchoutcomes.gather(state, store)
    assert failures == {}
    entry = Path(config.bucket_name, cache_key(data.content_hash()))
    ino = (entry / "a.txt").stat().st_ino
    assert [tuple(v) for v in values] == [(0, ino), (1, ino), (2, ino)]


def test_an_entry_changed_after_its_marker_is_no_longer_trusted_unread(tmp_path: Path) -> None:
    """The no-read check (every ctime before the marker's) fails once a file is written,
    even with its size and mtime put back, so the entry is hashed again."""
    from airflow_provider_kinetic.core.data import cache as datacache
    from airflow_provider_kinetic.core.data.schemes import entrycheck

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(TRUE_BYTES)
    store = KineticConfig(backend="local", root=str(tmp_path / "root")).store()
    data = Data(str(src))
    datacache.upload_data(store, data)
    entry = Path(store.bucket, cache_key(data.content_hash()))
    assert entrycheck.sealed(str(entry))
    st = (entry / "a.txt").stat()
    (entry / "a.txt").chmod(0o644)
    (entry / "a.txt").write_bytes(b"X" * len(TRUE_BYTES))
    os.utime(entry / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not entrycheck.sealed(str(entry))
    assert not entrycheck.check_entry(str(entry), data.content_hash(), True).sound
