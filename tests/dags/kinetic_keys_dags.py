"""DAG exercised by tests/integration/core/keys/test_keys_dags.py: keys from a Python task (the
``kinetic`` connection) and from inside a remote function (the job's own store, no
connection)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
WORK = os.environ.get("KINETIC_KEYS_TEST_DIR", "/tmp/kinetic-keys-test")


def in_the_job(work: str) -> dict:
    """Reads the task's key and publishes a new one, with no connection."""
    import os
    import sys

    from airflow_provider_kinetic import store

    got = store.get("keys-dag/input", os.path.join(work, "in-job"))
    with open(os.path.join(work, "in-job", "x.txt")) as f:
        text = f.read()
    out = os.path.join(work, "made")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "y.txt"), "w") as f:
        f.write(text.upper())
    put = store.put("keys-dag/output", out)
    return {
        "got": got["version"],
        "put": put["version"],
        "by": put["by"],
        "airflow_imported": "airflow" in sys.modules,
    }


with DAG("kinetic_keys", schedule=None, start_date=START, catchup=False) as keys_dag:

    @task
    def publish() -> dict:
        from airflow_provider_kinetic import store

        src = os.path.join(WORK, "src")
        os.makedirs(src, exist_ok=True)
        with open(os.path.join(src, "x.txt"), "w") as f:
            f.write("hello keys")
        return store.put("keys-dag/input", src)

    @task
    def consume() -> dict:
        from airflow_provider_kinetic import store

        row = store.get("keys-dag/output", os.path.join(WORK, "back"))
        with open(os.path.join(WORK, "back", "y.txt")) as f:
            return {"row": row, "text": f.read()}

    job = KineticRunOperator(
        task_id="job", python_callable=in_the_job, op_args=[WORK], poll_interval=0.2
    )
    publish() >> job >> consume()
