"""A job that prints a captured secret: tests/integration/test_secrets.py then finds the
value nowhere on disk (Airflow home, task logs, the store, job logs)."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator


def leak(tag: str) -> int:
    import os

    value = os.environ["KN_SECRET_TOKEN"]
    print(f"{tag}: the token is {value}", flush=True)
    return len(value)


with DAG(
    "kinetic_secret",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(
        task_id="single",
        python_callable=leak,
        op_args=["single"],
        capture_env_vars=["KN_SECRET_*"],
        poll_interval=0.2,
    )
    KineticMapOperator(
        task_id="batch",
        python_callable=leak,
        inputs=["child-0", "child-1"],
        capture_env_vars=["KN_SECRET_TOKEN"],
        poll_interval=0.2,
        deferrable=True,
    )
