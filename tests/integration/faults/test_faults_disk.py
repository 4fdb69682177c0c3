"""The disk fills while a result is written: an error that says what, where and how
much, in the task's error; never a signature without its data, nor a partial file.
The disk fills during a ``Data`` upload: no cache content without a marker is left.

Two ways to fill a disk, the same assertions:

- ``tmpfs``: the store is a real 2 MiB tmpfs mounted for the test (skipped where this
  user may not mount one); the kernel answers ``ENOSPC``.
- ``injected``: ``tests/fixtures/full_disk/sitecustomize.py`` on the job processes'
  ``PYTHONPATH`` (and the same wrapper in this process for the store test) makes
  binary files opened under the store accept 1 MiB, then raise ``ENOSPC`` at the
  write, as a full disk does.  Runs everywhere.

Real parts otherwise: ``dag.test()``, the local backend, the real runner in its
subprocess writing through the real ``file://`` store.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.jobs.results import read_result
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore, StoreFullError
from airflow_provider_kinetic.core.storage.local import TMP_SUFFIX
from airflow_provider_kinetic.deployment.signing import result_key
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.local_conn import cancel_jobs, set_local_conn

LOGICAL = pendulum.datetime(2026, 11, 25, tz="UTC")
FULL_DISK = Path(__file__).resolve().parents[2] / "fixtures" / "full_disk"
ROOM = 1024 * 1024  # injected: bytes a file may take
TMPFS = "2m"
RESULT = 3 * 1024 * 1024  # more than either


@pytest.fixture(params=["tmpfs", "injected"])
def full_root(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store root on a disk that fills up (see the module docstring)."""
    root = tmp_path / "store"
    root.mkdir()
    mounted = False
    if request.param == "tmpfs":
        made = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS}", "tmpfs", str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
        mounted = True
    else:
        monkeypatch.setenv("KINETIC_TEST_FULL_DISK", str(root))
        monkeypatch.setenv("KINETIC_TEST_FULL_DISK_BYTES", str(ROOM))
        path = os.environ.get("PYTHONPATH")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FULL_DISK), path])))
        _inject_here(monkeypatch)
        # The injection reaches the job's processes through the worker's environment:
        # test plumbing, so the jobs inherit it (a job sees only its runtime otherwise).
        monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_INHERIT_ENV", "True")
    set_local_conn(monkeypatch, root, "kinetic_faults")
    try:
        yield root
    finally:
        cancel_jobs(root)
        if mounted:
            subprocess.run(["umount", str(root)], check=True)


def _inject_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sitecustomize's wrapper in this process too (it runs only at start-up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_full_disk", FULL_DISK / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    real = os.fdopen
    spec.loader.exec_module(module)  # replaces os.fdopen (it reads the env set above)
    wrapper, os.fdopen = os.fdopen, real
    monkeypatch.setattr(os, "fdopen", wrapper)  # so that teardown puts the real one back


def test_a_full_disk_names_key_path_size_and_free_space(full_root):
    store = LocalStore(str(full_root))
    with pytest.raises(StoreFullError) as info:
        store.write_bytes("job-x/result.pkl", b"r" * RESULT)
    text = str(info.value)
    assert f"writing {store.uri('job-x/result.pkl')} ({RESULT} bytes)" in text
    assert f"at {full_root}/job-x/result.pkl" in text
    free = int(re.search(r"\((\d+) bytes free there\)", text).group(1))
    assert free >= 0 and info.value.errno is not None
    # Nothing under the name, no temp file left; a write that fits still works.
    assert not store.exists("job-x/result.pkl")
    assert [p for p in full_root.rglob("*") if p.name.endswith(TMP_SUFFIX)] == []
    store.write_bytes("job-x/result.pkl", b"small")
    assert store.read_bytes("job-x/result.pkl") == b"small"


def test_a_full_disk_while_the_result_is_written_reaches_the_task(
    load_dag, full_root, tmp_path, capfd, caplog
):
    marker = tmp_path / "executions"
    dag = load_dag("kinetic_fault_dags.py", "kinetic_fault_disk_full")
    dr = dag.test(logical_date=LOGICAL, run_conf={"marker": str(marker), "size": RESULT})
    assert dr.state == "failed", task_states(dr)
    out = "".join(capfd.readouterr()) + caplog.text
    job = JobHandle.from_dict(
        {(t, k): v for (t, k, _), v in xcoms(dr).items()}[("big", "kinetic_job")]
    )
    path = f"{full_root}/{job.job_id}/result.pkl"
    # The task's error says what was written where, how big, and the room left; its
    # class is the store's (the function ran: never re-submitted).
    failed = "airflow_provider_kinetic.exceptions.KineticStoreError: "
    error = next(line for line in out.splitlines() if failed in line)
    assert "the job's result could not be stored" in error, error
    assert f"at {path} (" in error and "bytes free there" in error, error
    assert int(re.search(r"result\.pkl \((\d+) bytes\)", error).group(1)) > RESULT
    assert marker.read_text().count("ran") == 1
    # What the store holds is a pair: the runner's note of the failure, then its
    # signature; nothing half-written.
    store = LocalStore(str(full_root))
    note = read_result(store, job.job_id, (0,), result_key(job))
    assert note["success"] is False and note["phase"] == "store result"
    assert store.exists(f"{job.job_id}/result.pkl.sig")
    assert [p for p in full_root.rglob("*") if p.name.endswith(TMP_SUFFIX)] == []


def test_a_data_upload_into_a_full_store_leaves_no_markerless_files(full_root, tmp_path):
    """Issue 38, case 9: a Data upload the disk cannot hold fails naming the file, and
    what it had copied of the entry goes with it: no content without a marker (which
    nothing reads and ``data gc`` never collects) is left on the full disk.  With room
    again, the same Data uploads whole."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("a.bin", "b.bin"):  # small: they fit
        (tree / name).write_bytes(os.urandom(64 * 1024))
    (tree / "c.bin").write_bytes(os.urandom(RESULT))  # more than either disk takes
    store = LocalStore(str(full_root))
    data = Data(str(tree))
    digest = data.content_hash()
    # The entry's files are copied in parallel: the error names the one whose write met
    # the full disk first (c.bin fills it, but a copy beside it may fail before it does:
    # b.bin did once under load).
    with pytest.raises(StoreFullError, match=re.escape(digest) + r"/[abc]\.bin"):
        datacache.upload_data(store, data)
    assert not store.exists(datacache.marker_key(digest))
    assert store.list(datacache.cache_key(digest) + "/") == []
    assert [p for p in full_root.rglob("*") if p.is_file()] == []

    (tree / "c.bin").write_bytes(os.urandom(ROOM // 4))  # now it fits
    data = Data(str(tree))
    assert datacache.upload_data(store, data) is True
    assert store.exists(datacache.marker_key(data.content_hash()))
