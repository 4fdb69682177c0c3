"""Why a local job failed, as its status says: a job whose process never started
names the first error it printed and the interpreter that printed it; "killed" is
said only when a signal ended the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local import backend as local
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from tests.fixtures.waiting import wait_for

#: Process waits on a loaded 2-core machine.
WAIT_S = 120.0


def ended(backend: LocalBackend, handle: JobHandle) -> StatusReport:
    def terminal() -> StatusReport | None:
        report = backend.status(handle)
        return report if report.status.is_terminal else None

    return wait_for(f"job {handle.job_id} to end", terminal, WAIT_S)


def write_pid_and_wait(pid_file: str, release: str) -> str:
    """The job: says which process runs it, then waits (bounded) for a file."""
    import time

    Path(pid_file + ".tmp").write_text(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    deadline = time.monotonic() + 300
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)  # timing-ok: the job's own workload, held until the test releases it
    return "released"


def bare_python(where: Path) -> str:
    """A fresh venv's interpreter, which cannot import the provider (checked)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120
    )
    python = str(where / "bin" / "python")
    cannot = subprocess.run(
        [python, "-c", "import airflow_provider_kinetic"], capture_output=True, timeout=120,
        cwd=where,
    )  # fmt: skip
    assert cannot.returncode != 0, "the fresh venv can import the provider"
    return python


def test_a_job_whose_interpreter_cannot_import_the_provider_says_so(
    config: KineticConfig,
    backend: LocalBackend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DAG's process imports the provider (here: installed in the test's venv), the
    interpreter the job starts cannot (a fresh venv without it): the job fails naming
    the import error and that interpreter, not "killed" (nothing killed it).  Here its
    supervisor is what cannot start, so no exit code is ever written."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # nothing hands it the package
    python = bare_python(tmp_path / "bare-venv")
    monkeypatch.setattr(sys, "executable", python)  # the interpreter jobs are started with
    handle, _ = submit_job(JobRequest(func=print, args=("never printed",)), config, backend)
    report = ended(backend, handle)
    log = backend.read_logs(handle)[0]
    assert "No module named 'airflow_provider_kinetic'" in log  # what it printed
    assert report.status is JobStatus.FAILED, report.describe()
    reason = report.reason or ""
    assert "ModuleNotFoundError: No module named 'airflow_provider_kinetic'" in reason, reason
    assert python in reason, reason
    assert "killed" not in reason, reason


def test_a_job_killed_by_sigkill_reads_as_killed(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path
) -> None:
    """The job's own process (not its supervisor) SIGKILLed, as the OOM killer does:
    the supervisor records the signal, and the status says killed, by which signal."""
    pid_file, release = str(tmp_path / "pid"), str(tmp_path / "release")
    handle, _ = submit_job(
        JobRequest(func=write_pid_and_wait, args=(pid_file, release)), config, backend
    )
    pid = int(wait_for("the job's pid", lambda: Path(pid_file).exists(), WAIT_S) and
              Path(pid_file).read_text())  # fmt: skip
    os.kill(pid, signal.SIGKILL)
    report = ended(backend, handle)
    assert report.status is JobStatus.FAILED, report.describe()
    reason = report.reason or ""
    assert "killed" in reason and "SIGKILL" in reason, reason


def test_a_runner_whose_interpreter_cannot_import_the_provider_says_so(
    config: KineticConfig,
    backend: LocalBackend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervisor starts, the runner's interpreter (as a requirements venv would
    be, were it missing the provider) cannot import it: the supervisor writes exit
    code 1, and the status adds the error and the interpreter the runner ran."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    python = bare_python(tmp_path / "bare-venv")
    command = local.local_command
    monkeypatch.setattr(local, "local_command", lambda spec, _=None: command(spec, python))
    handle, _ = submit_job(JobRequest(func=print, args=("never printed",)), config, backend)
    report = ended(backend, handle)
    assert report.status is JobStatus.FAILED, report.describe()
    reason = report.reason or ""
    assert reason.startswith("exit code 1 before the runner started: "), reason
    assert "ModuleNotFoundError: No module named 'airflow_provider_kinetic'" in reason, reason
    assert python in reason and "killed" not in reason, reason


def test_a_job_that_ran_and_failed_keeps_its_exit_code(
    config: KineticConfig, backend: LocalBackend
) -> None:
    """A traceback the function printed is the function's error, collected from its
    result payload: the status stays the exit code (the runner had started)."""
    handle, _ = submit_job(JobRequest(func=int, args=("not a number",)), config, backend)
    report = ended(backend, handle)
    assert "ValueError" in backend.read_logs(handle)[0]
    assert report == StatusReport(JobStatus.FAILED, "exit code 1")
