"""A local job's process tree lives and dies together: a SIGKILLed supervisor leaves no
runner behind, the job never reads as FAILED while a process of it still runs (so a
retry never starts a second runner beside the first), and a retry runs exactly once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from tests.fixtures.waiting import wait_for


def hold(pid_file: str, release: str, counter: str, fork: bool) -> str:
    """The job: says which processes run it (with ``fork``, a child forked with the
    runner's fds too), waits (bounded) for the release file, then counts its run."""
    import time

    pids = [os.getpid()]
    if fork and (child := os.fork()) == 0:
        deadline = time.monotonic() + 300
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)  # timing-ok: the job's own workload, held until released
        os._exit(0)
    if fork:
        pids.append(child)
    Path(pid_file + ".tmp").write_text(" ".join(map(str, pids)))
    os.replace(pid_file + ".tmp", pid_file)
    deadline = time.monotonic() + 300
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)  # timing-ok: the job's own workload, held until the test releases it
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    return "ran"


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_killed_supervisor_takes_its_runner_and_a_retry_runs_once(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path
) -> None:
    pids, release, counter = tmp_path / "pids", tmp_path / "release", tmp_path / "count"
    args = (str(pids), str(release), str(counter), False)
    handle, _ = submit_job(JobRequest(func=hold, args=args), config, backend)
    runner = int(wait_for("the runner's pid", lambda: pids.exists() and pids.read_text()))
    supervisor = int((Path(backend.job_dir(handle.job_id)) / "pid").read_text())
    assert supervisor != runner and running(runner)
    os.kill(supervisor, signal.SIGKILL)
    report = ended_while_nothing_runs(backend, handle, [runner])
    assert report.status is JobStatus.FAILED, report.describe()
    # Nothing of the first try runs: released now, it cannot count a run.
    release.write_text("")
    log = Path(backend.job_dir(handle.job_id), "log").read_bytes()
    retry, _ = submit_job(JobRequest(func=hold, args=args), config, backend)
    again = ended_while_nothing_runs(backend, retry, [])
    assert again.status is JobStatus.SUCCEEDED, backend.read_logs(retry)[0]
    assert collect(config.store(), retry.job_id, again.status) == "ran"
    assert counter.read_text().splitlines() == [pids.read_text()], "one run: the retry's"
    assert not Path(backend.job_dir(handle.job_id), "exit_code").exists()
    assert Path(backend.job_dir(handle.job_id), "log").read_bytes() == log
    backend.release(handle)
    assert not os.path.exists(backend.job_dir(handle.job_id))


def test_what_the_runner_forked_ends_before_the_job_reads_failed(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path
) -> None:
    """A process the function forked (multiprocessing's fork workers, say) survives
    the runner's SIGKILL: it holds the job's run lock, so the job reads RUNNING (a
    retry adopts it) and its status ends it; FAILED only once nothing of it runs, and
    its dir is kept until then."""
    pids, release, counter = tmp_path / "pids", tmp_path / "release", tmp_path / "count"
    args = (str(pids), str(release), str(counter), True)
    handle, _ = submit_job(JobRequest(func=hold, args=args), config, backend)
    wait_for("the job's pids", lambda: pids.exists())
    runner, forked = map(int, pids.read_text().split())
    supervisor = int((Path(backend.job_dir(handle.job_id)) / "pid").read_text())
    os.kill(supervisor, signal.SIGKILL)
    backend.release(handle)  # before any status ended it, the forked process runs on
    assert running(forked) and os.path.isdir(backend.job_dir(handle.job_id))
    report = ended_while_nothing_runs(backend, handle, [runner, forked])
    assert report.status is JobStatus.FAILED, report.describe()
    assert not running(forked) and not running(runner)
    release.write_text("")
    assert not counter.exists()


def ended_while_nothing_runs(
    backend: LocalBackend, handle: JobHandle, pids: list[int]
) -> StatusReport:
    """The job's terminal report, polled; when a poll reads it ended, none of ``pids``
    still runs (a process can only stop running, so none ran at that read)."""

    def terminal() -> StatusReport | None:
        report = backend.status(handle)
        if not report.status.is_terminal:
            return None
        still = [pid for pid in pids if running(pid)]
        assert not still, f"{report.describe()} while process(es) {still} of it run"
        return report

    return wait_for(
        f"job {handle.job_id} to end", terminal, detail=lambda: backend.read_logs(handle)[0]
    )
