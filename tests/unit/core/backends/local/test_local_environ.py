"""The rule of a local job's environment (``core.backends.local_environ``)."""

from __future__ import annotations

from airflow_provider_kinetic.core.backends.local.environ import job_environment

WORKER = {
    "PATH": "/usr/bin",
    "HOME": "/home/w",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/tmp/w",
    "PYTHONPATH": "/src",
    "VIRTUAL_ENV": "/venv",
    "CUDA_VISIBLE_DEVICES": "0",
    "KINETIC_LOCAL_MAX_JOBS": "2",
    "KINETIC_LOCAL_SLOTS": "/tmp/slots",
    "AIRFLOW__CORE__FERNET_KEY": "k",
    "AIRFLOW_CONN_GCP": "google-cloud-platform://",
    "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json",
    "AWS_SECRET_ACCESS_KEY": "a",
    "SECRET_TOKEN": "t",
    "KINETIC_TEST_SCRATCH": "/tmp/scratch",  # not kinetic's: captured or passed in
}
SECRETS = {
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW_CONN_GCP",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AWS_SECRET_ACCESS_KEY",
    "SECRET_TOKEN",
    "KINETIC_TEST_SCRATCH",
}


def test_runtime_and_machinery_stay_settings_and_secrets_go() -> None:
    env = job_environment(WORKER, {})
    assert env == {k: v for k, v in WORKER.items() if k not in SECRETS}


def test_captured_and_overlay_join_and_the_overlay_wins() -> None:
    overlay = {"JOB_ID": "j1", "TMPDIR": "/tmp/job", "CUDA_VISIBLE_DEVICES": ""}
    env = job_environment(WORKER, overlay, captured={"SECRET_TOKEN": "t", "JOB_ID": "x"})
    assert env["SECRET_TOKEN"] == "t"
    assert env["JOB_ID"] == "j1" and env["TMPDIR"] == "/tmp/job"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # the backend's devices, not the worker's
    assert "AWS_SECRET_ACCESS_KEY" not in env


def test_inherit_keeps_the_whole_worker_environment() -> None:
    env = job_environment(WORKER, {"JOB_ID": "j1"}, inherit=True)
    assert env == {**WORKER, "JOB_ID": "j1"}


def test_the_worker_environment_is_not_changed() -> None:
    worker = dict(WORKER)
    job_environment(worker, {"PATH": "/job/bin"}, captured={"X": "1"})
    assert worker == WORKER
