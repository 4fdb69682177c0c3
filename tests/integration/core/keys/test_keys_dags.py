"""Keys in a real ``dag.test()`` run on the local backend: a Python task puts with the
``kinetic`` connection, a remote function gets and puts with no connection (the job's
own store), a later task reads what the job put, and who put each version is known."""

from __future__ import annotations

from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")


def test_keys_from_a_task_and_from_inside_a_job(
    load_dag, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_KEYS_TEST_DIR", str(tmp_path))
    dag = load_dag("kinetic_keys_dags.py", "kinetic_keys")
    dr = dag.test(logical_date=LOGICAL)
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert states == {"publish": "success", "job": "success", "consume": "success"}, states
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    published = x[("publish", "return_value")]
    in_job = x[("job", "return_value")]
    consumed = x[("consume", "return_value")]

    assert in_job["got"] == published["version"]  # the job read the task's key
    assert in_job["airflow_imported"] is False  # no connection, no Airflow in the job
    assert consumed["text"] == "HELLO KEYS" and consumed["row"]["version"] == in_job["put"]
    task_who = {"dag_id": "kinetic_keys", "task_id": "publish", "run_id": dr.run_id}
    assert {k: published["by"][k] for k in task_who} == task_who
    job_id = x[("job", "kinetic_job")]["job_id"]
    assert in_job["by"]["job_id"] == job_id
    assert (in_job["by"]["dag_id"], in_job["by"]["task_id"]) == ("kinetic_keys", "job")

    # The job's store is the connection's: the DAG's default local root.
    keys = KeyStore(KineticConfig(backend="local", root=str(airflow_home / "kinetic")).store())
    rows = {r["key"]: r for r in keys.ls("keys-dag/")}
    assert rows["keys-dag/output"]["version"] == in_job["put"]
    assert rows["keys-dag/input"]["version"] == published["version"]
