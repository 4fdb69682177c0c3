"""GPUs on the local backend, on injected machines (``KINETIC_LOCAL_GPUS``): real
submits, real supervisors and runners, real ``flock``s in a per-test lock dir.

Each job's function returns the ``CUDA_VISIBLE_DEVICES`` it ran with; jobs that must
overlap wait for a file the test creates, so nothing here is synchronised by sleeping.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local import supervise
from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR, LocalBackend
from airflow_provider_kinetic.core.backends.local.gpus import GPUS_ENV, LOCKS_ENV, LocalGpuError
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from tests.fixtures.waiting import ended, wait_for


def devices_when(go: str | None = None) -> dict[str, str | None]:
    """The job: once ``go`` exists (if given), what CUDA sees of this machine."""
    deadline = time.monotonic() + 60
    while go is not None and not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's go file
    return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}


@pytest.fixture
def machine(monkeypatch, tmp_path: Path) -> Callable[[str], None]:
    """Inject this machine's GPUs; locks go to the test's own dir."""
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "gpu-locks"))

    def inject(names: str) -> None:
        monkeypatch.setenv(GPUS_ENV, names)

    return inject


def run(config: KineticConfig, backend: LocalBackend, accelerator: str, *args: Any) -> JobHandle:
    request = JobRequest(func=devices_when, args=args, options=JobOptions(accelerator=accelerator))
    return submit_job(request, config, backend)[0]


def status_is(backend: LocalBackend, handle: JobHandle, status: JobStatus):
    def check() -> StatusReport | None:
        report = backend.status(handle)
        return report if report.status is status else None

    return check


def result(config: KineticConfig, backend: LocalBackend, handle: JobHandle) -> dict:
    report = wait_for("the end", lambda: ended(backend.status(handle)))
    assert report.status is JobStatus.SUCCEEDED, backend.read_logs(handle)[0]
    return collect(config.store(), handle.job_id, report.status)


def test_two_jobs_get_a_device_each(config, backend, machine, tmp_path: Path) -> None:
    machine("NVIDIA L4,NVIDIA L4")
    go = str(tmp_path / "go")
    first = run(config, backend, "gpu-l4x1", go)
    second = run(config, backend, "gpu-l4x1", go)
    for handle in (first, second):  # both hold their device at once
        wait_for("both jobs running", status_is(backend, handle, JobStatus.RUNNING))
    Path(go).touch()
    seen = [result(config, backend, h) for h in (first, second)]
    assert sorted(s["CUDA_VISIBLE_DEVICES"] for s in seen) == ["0", "1"]
    assert {s["CUDA_DEVICE_ORDER"] for s in seen} == {"PCI_BUS_ID"}
    assert "kinetic: GPU(s) [" in backend.read_logs(first)[0]


def test_a_job_waits_queued_for_a_free_device(config, backend, machine, tmp_path) -> None:
    machine('["NVIDIA H100 80GB HBM3", "NVIDIA L4"]')
    go = str(tmp_path / "go")
    first = run(config, backend, "gpu-l4x1", go)
    wait_for("the first job running", status_is(backend, first, JobStatus.RUNNING))
    second = run(config, backend, "l4", None)
    queued = wait_for("the second job queued", status_is(backend, second, JobStatus.PENDING))
    queued = wait_for("queued", lambda: (r := backend.status(second)).reason == "queued" and r)
    assert queued == StatusReport(
        JobStatus.PENDING, "queued", "waiting for 1 free nvidia-l4 GPU (0 of 1 free)"
    )
    assert queued.describe() == "PENDING (queued): waiting for 1 free nvidia-l4 GPU (0 of 1 free)"
    assert "kinetic: queued: waiting for 1 free nvidia-l4 GPU" in backend.read_logs(second)[0]
    assert backend.status(first).status is JobStatus.RUNNING  # the queue took nothing
    Path(go).touch()
    assert result(config, backend, first)["CUDA_VISIBLE_DEVICES"] == "1"
    assert result(config, backend, second)["CUDA_VISIBLE_DEVICES"] == "1"  # the L4, freed


def test_a_killed_job_frees_its_device(config, backend, machine, tmp_path) -> None:
    machine("NVIDIA L4")
    first = run(config, backend, "gpu-l4x1", str(tmp_path / "never"))
    wait_for("the first job running", status_is(backend, first, JobStatus.RUNNING))
    second = run(config, backend, "gpu-l4x1", None)
    wait_for("the second job queued", lambda: backend.status(second).reason == "queued")
    pgid = int(Path(backend.job_dir(first.job_id), "pid").read_text())
    os.killpg(pgid, signal.SIGKILL)  # supervisor and runner: no clean-up of their own
    assert result(config, backend, second)["CUDA_VISIBLE_DEVICES"] == "0"
    report = wait_for("the killed job failed", status_is(backend, first, JobStatus.FAILED))
    assert "killed" in (report.reason or "")


def test_cancelling_a_queued_job(config, backend, machine, tmp_path) -> None:
    machine("NVIDIA L4")
    go = str(tmp_path / "go")
    first = run(config, backend, "gpu-l4x1", go)
    wait_for("the first job running", status_is(backend, first, JobStatus.RUNNING))
    second = run(config, backend, "gpu-l4x1", None)
    wait_for("the second job queued", lambda: backend.status(second).reason == "queued")
    backend.cancel(second)
    assert backend.status(second) == StatusReport(JobStatus.FAILED, "cancelled")
    Path(go).touch()
    assert result(config, backend, first)["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(
    "accelerator, message",
    [
        ("gpu-h100x1", "this machine has 2x NVIDIA L4 (l4); asked for gpu-h100x1"),
        ("gpu-l4x4", "asked for gpu-l4x4 (4 GPUs) but this machine has 2 l4: 2x NVIDIA L4"),
    ],
)
def test_what_the_machine_lacks_fails_before_upload(
    config, backend, machine, accelerator, message
) -> None:
    machine("NVIDIA L4,NVIDIA L4")
    with pytest.raises(LocalGpuError) as err:
        run(config, backend, accelerator, None)
    assert message in str(err.value)
    assert config.store().list("") == []  # nothing uploaded
    assert not Path(config.bucket_name, STATE_DIR).exists()


def test_no_gpu_here_runs_on_the_cpu_with_no_device(config, backend, machine, caplog) -> None:
    machine("")
    caplog.set_level("INFO", logger="airflow_provider_kinetic")
    handle = run(config, backend, "gpu-h100x8", None)
    result(config, backend, handle)
    assert "running gpu-h100x8 job on the CPU (no GPU assigned)" in caplog.text
    assert not Path(backend.job_dir(handle.job_id), supervise.GPUS_FILE).exists()


def test_a_cpu_job_on_a_gpu_machine_sees_no_gpu(config, backend, machine) -> None:
    machine("NVIDIA L4")
    assert result(config, backend, run(config, backend, "cpu", None)) == {
        "CUDA_VISIBLE_DEVICES": "",
        "CUDA_DEVICE_ORDER": None,
    }
