"""A local job's environment on real jobs (``core.backends.local_environ``): what a GKE
job would see (the captured variables) plus what running here needs; never the
worker's settings and secrets unless captured, or unless ``[kinetic]
local_inherit_env`` asks for the worker's whole environment."""

from __future__ import annotations

import os

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus
from tests.fixtures.waiting import ended, wait_for

#: Worker variables a job must not see uncaptured (named like what they stand for).
WORKER_ONLY = {
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key-of-the-worker",
    "AIRFLOW_CONN_KINETIC_ENV_TEST": "google-cloud-platform://?key=worker-only",
    "SECRET_TOKEN": "worker-secret-token",
}
SEEN = [*WORKER_ONLY, "CAPTURED_TOKEN", "PATH", "HOME", "PYTHONPATH", "TMPDIR", "JOB_ID"]


def job_env(names: list[str]) -> dict:
    import os

    return {name: os.environ.get(name) for name in names}


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**WORKER_ONLY, "CAPTURED_TOKEN": "captured-value"}.items():
        monkeypatch.setenv(name, value)


def run(config: KineticConfig, backend: LocalBackend, signing_secret: bytes | None = None):
    request = JobRequest(func=job_env, args=(SEEN,), capture_env_vars=["CAPTURED_TOKEN"])
    handle, _ = submit_job(request, config, backend, signing_secret=signing_secret)
    report = wait_for(
        f"job {handle.job_id} to finish",
        lambda: ended(backend.status(handle)),
        detail=lambda: backend.read_logs(handle)[0],
    )
    assert report.status is JobStatus.SUCCEEDED, backend.read_logs(handle)[0]
    return collect(config.store(), handle.job_id, report.status), handle


@pytest.mark.parametrize("signed", [False, True], ids=["payload-env", "secrets-file"])
def test_a_job_sees_the_captured_and_runtime_variables_not_the_workers_settings(
    config, backend, worker_env, signed
) -> None:
    seen, handle = run(config, backend, b"s" * 32 if signed else None)
    for name in WORKER_ONLY:
        assert seen[name] is None, f"{name} reached the job uncaptured"
    assert seen["CAPTURED_TOKEN"] == "captured-value"
    assert seen["PATH"] == os.environ["PATH"]
    assert seen["HOME"] == os.environ["HOME"]
    assert seen["PYTHONPATH"] == os.environ.get("PYTHONPATH")  # imports what the worker can
    assert seen["TMPDIR"] and seen["TMPDIR"] != os.environ.get("TMPDIR")  # the job's own
    assert seen["JOB_ID"] == handle.job_id


def test_local_inherit_env_gives_the_job_the_workers_whole_environment(
    config, worker_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kinetic.deployment.backends import backend_for

    assert not backend_for(config).inherit_env  # the default: the rule above
    monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_INHERIT_ENV", "True")
    backend = backend_for(config)
    assert isinstance(backend, LocalBackend) and backend.inherit_env
    seen, _ = run(config, backend)  # waits for the job's end: no process is left
    for name, value in WORKER_ONLY.items():
        assert seen[name] == value
    assert seen["CAPTURED_TOKEN"] == "captured-value"
