"""The result-signing key is rotated between submit and collect (a routine rotation).

Real parts: Airflow ``dag.test()`` runs a synchronous task on the local backend; the
job runs in its real supervisor and runner.  While the job holds, the test changes
``[kinetic] result_signing_keys`` (the environment Airflow reads its options from),
then releases it.  The task's record was sealed, and the job's key derived, with the
old key; the result is collected under the new ring.

- Old key kept in the ring: the task succeeds with the job's result.
- Old key dropped: the task fails saying the signing key changed and naming the old
  key's id; a retry (the same task run again) fails just as clearly instead of
  ignoring its record and running the function again; with the old key back in the
  ring, the next run collects the job's original result.  The function runs once.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.jobs.signing import key_id
from airflow_provider_kinetic.core.jobs.taskrecord import RECORDS_PREFIX
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.local_conn import cancel_jobs, set_local_conn
from tests.fixtures.waiting import wait_for

LOGICAL = pendulum.datetime(2026, 11, 24, tz="UTC")
#: Fixed, so every ``dag.test()`` here runs (clears, then re-runs) the same DAG run: the
#: run id is made from it, and the task's record is keyed by the run id.
RUN_AFTER = pendulum.datetime(2026, 11, 24, 1, tz="UTC")
RING = "AIRFLOW__KINETIC__RESULT_SIGNING_KEYS"


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # noqa: ANN201 - a generator
    root = set_local_conn(monkeypatch, tmp_path / "store", "kinetic_faults")
    monkeypatch.setenv(RING, "key-a")  # restored at teardown, whatever the thread set
    yield root
    cancel_jobs(root)


def kid(ring: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The key id of the newest key of ``ring`` (as the deployment would derive it)."""
    with monkeypatch.context() as m:
        m.setenv(RING, ring)
        return key_id(bytes(deployment_secret()))


def run(load_dag, tmp_path: Path, rotate_to: str | None):  # noqa: ANN001, ANN201
    """One run of the task; with ``rotate_to``, the ring changes while the job holds."""
    marker, release = tmp_path / "executions", tmp_path / "release"
    if rotate_to is None:
        release.touch()
    ended = threading.Event()

    def rotate() -> None:
        wait_for("the job to start", lambda: marker.exists() or ended.is_set())
        import os

        os.environ[RING] = rotate_to
        release.touch()

    thread = threading.Thread(target=rotate, name="rotate-key") if rotate_to else None
    if thread:
        thread.start()
    try:
        dag = load_dag("kinetic_fault_dags.py", "kinetic_fault_rotation")
        conf = {"marker": str(marker), "release": str(release), "token": "t-keys"}
        return dag.test(logical_date=LOGICAL, run_after=RUN_AFTER, run_conf=conf)
    finally:
        ended.set()
        if thread:
            thread.join(timeout=60)


def only_record(root: Path) -> dict:
    (path,) = sorted((root / RECORDS_PREFIX).rglob("*.json"))
    return json.loads(path.read_text())


def test_rotation_keeping_the_old_key_collects_the_result(load_dag, root, tmp_path, monkeypatch):
    dr = run(load_dag, tmp_path, rotate_to="key-b, key-a")
    assert dr.state == "success", task_states(dr)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert x[("held", "return_value")] == {"answer": 42, "token": "t-keys"}
    assert x[("held", "kinetic_job")]["result_key_id"] == kid("key-a", monkeypatch)
    assert (tmp_path / "executions").read_text().count("ran") == 1
    # The record that says "delivered" was sealed with the key the try started with
    # (a try reads the keyring once, as a worker restarted for a rotation does); the
    # ring after the rotation still holds it, so the next try reads the record.
    sealed = only_record(root)
    assert sealed["kid"] == kid("key-a", monkeypatch) and sealed["record"]["delivered"]


def logs(capfd, caplog) -> str:  # noqa: ANN001 - pytest fixtures
    """What the run logged, wherever Airflow's logging sent it; consumed."""
    text = "".join(capfd.readouterr()) + caplog.text
    caplog.clear()
    return text


def test_rotation_dropping_the_old_key_fails_clearly_and_never_reruns(
    load_dag, root, tmp_path, monkeypatch, capfd, caplog
):
    old = kid("key-a", monkeypatch)
    dr = run(load_dag, tmp_path, rotate_to="key-b")
    assert dr.state == "failed"
    out = logs(capfd, caplog)
    assert f"was sealed with signing key {old}" in out and "the signing key changed" in out
    sealed = only_record(root)
    assert sealed["kid"] == old and sealed["record"]["delivered"] is False
    job_id = sealed["record"]["handle"]["job_id"]

    # The retry: the record names a job it cannot verify; it fails, it does not rerun.
    dr = run(load_dag, tmp_path, rotate_to=None)
    assert dr.state == "failed"
    out = logs(capfd, caplog)
    assert f"was sealed with signing key {old}" in out
    assert "does not run the function again" in out
    assert (tmp_path / "executions").read_text().count("ran") == 1
    assert sorted(p.name for p in root.glob("job-*")) == [job_id]  # no second job

    # The old key back in the ring (after the new one): the job's own result arrives.
    monkeypatch.setenv(RING, "key-b,key-a")
    dr = run(load_dag, tmp_path, rotate_to=None)
    assert dr.state == "success", task_states(dr)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert x[("held", "return_value")] == {"answer": 42, "token": "t-keys"}
    assert x[("held", "kinetic_job")]["job_id"] == job_id
    assert (tmp_path / "executions").read_text().count("ran") == 1
