"""Nothing is left on disk by jobs: the runner removes its work dir (context, downloaded
data) whatever the outcome; local job dirs hold only 0600 files in a 0700 dir."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from tests.fixtures.waiting import wait_for

SECRET = b"k" * 32


def use(path: str, i: int) -> int:
    import os

    if i % 7 == 3:
        raise RuntimeError(f"input {i} fails on purpose")
    return len(os.listdir(path)) + i


def test_fifty_jobs_and_a_batch_leave_no_work_dirs(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the jobs' temp dir: inspected afterwards
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("a")
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    store = config.store()
    handles = []
    for i in range(50):
        request = JobRequest(func=use, args=(Data(str(data)), i))
        handles.append(submit_job(request, config, backend, store, SECRET)[0])
    state, objects, local = plan_batch(
        JobRequest(func=use, kwargs={"path": Data(str(data))}),
        [{"i": i} for i in range(12)],
        "kwargs",
        store,
        config=config,
        max_concurrent=6,
        retries=0,
        fail_fast=False,
        signing_secret=SECRET,
    )
    batchlaunch.start_batch(state, objects, local, store)

    def poll() -> bool:  # as the batch's sensor would, every 0.1 s
        batchlaunch.launch(state, config, backend, store, SECRET)
        done = all(backend.status(h).status.is_terminal for h in handles)
        if done and state.finished:
            return True
        batchrun.observe(
            state, backend.batch_status(state.group_id, list(state.active.values())), backend, store
        )
        return False

    wait_for(
        "the 50 jobs and the batch to end",
        poll,
        240,
        interval=0.1,
        detail=lambda: batchrun.counts(state),
    )
    outcomes = [backend.status(h).status.value for h in handles]
    assert outcomes.count("FAILED") == 7 and outcomes.count("SUCCEEDED") == 43
    assert sorted(set(state.done.values())) == ["FAILED", "SUCCEEDED"]
    assert list(tmp.iterdir()) == []  # every runner removed its kinetic-run-* dir
    jobs = Path(config.bucket_name, ".local-jobs")
    for jdir in jobs.iterdir():
        assert stat.S_IMODE(jdir.stat().st_mode) == 0o700, jdir
        for path in jdir.iterdir():
            if path.name in ("spec.json", "secrets.json"):
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert not (jdir / "secrets.json").exists()
    # Job data in the local store is owner-only too: payload, handle, result.
    store_root = Path(config.bucket_name)
    for handle in handles[:5]:
        for name in ("payload.pkl", "handle.json", "result.pkl"):
            path = store_root / handle.job_id / name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def leave_temp_then_die(how: str) -> None:
    """Fill the temp dir, then end without any cleanup running."""
    import os
    import signal
    import tempfile

    os.makedirs(os.path.join(tempfile.gettempdir(), "left-by-the-function"))
    with open(os.path.join(tempfile.gettempdir(), "scratch.bin"), "wb") as f:
        f.write(b"x" * 4096)
    print("filled the temp dir", flush=True)
    if how == "exit":
        os._exit(3)  # no atexit, no finally: the runner cannot clean its work dir
    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSEGV)


def test_the_supervisor_removes_what_a_job_ended_by_exit_or_signal_left(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the supervisor's temp dirs go here
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    store = config.store()
    handles = []
    for how in ("exit", "kill", "segv"):
        req = JobRequest(func=leave_temp_then_die, args=(how,))
        handles.append(submit_job(req, config, backend, store, SECRET)[0])
    deadline = time.monotonic() + 120
    while not all(backend.status(h).status.is_terminal for h in handles):
        assert time.monotonic() < deadline, [backend.status(h) for h in handles]
        backend.wait(handles, 1.0)
    for handle in handles:
        report = backend.status(handle)
        assert report.status.value == "FAILED", report
        assert "filled the temp dir" in backend.read_logs(handle, 0)[0]
    # Every job had its own temp dir (the runner's work dir and the function's files
    # were in it), and the supervisor removed it once the job ended, however it ended.
    assert list(tmp.iterdir()) == []
    for handle in handles:
        backend.release(handle)  # collected: the job's state dir goes too
        assert not Path(config.bucket_name, ".local-jobs", handle.job_id).exists()


def test_the_supervisor_and_the_volume_links_name_the_same_shared_temp_dir():
    from airflow_provider_kinetic.core.backends.local import supervise
    from airflow_provider_kinetic.core.data import locallinks

    assert supervise.HOST_TMPDIR_ENV == locallinks.HOST_TMPDIR_ENV
