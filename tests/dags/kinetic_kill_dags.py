"""A deferrable task whose job runs for minutes: tests/integration/test_airflow_versions.py
marks it failed while it is deferred and expects the job to be cancelled."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator


def wait() -> None:
    """A wait that only a cancel ends (in time)."""
    import time

    time.sleep(300)


with DAG(
    "kinetic_kill",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(task_id="work", python_callable=wait, deferrable=True, poll_interval=1.0)
