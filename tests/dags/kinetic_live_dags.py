"""A deferrable job that prints a line per second for 20 s: tests/integration/
test_standalone.py reads the task log over the REST API while the task is deferred."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator


def ticker(seconds: int) -> int:
    import time

    for i in range(seconds):
        print(f"tick {i}", flush=True)
        time.sleep(1)
    return seconds


with DAG(
    "kinetic_live",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(
        task_id="tick", python_callable=ticker, op_args=[20], deferrable=True, poll_interval=1.0
    )
