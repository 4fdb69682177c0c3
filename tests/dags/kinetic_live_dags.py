"""A deferrable job that prints a tick line every half second until its release file
appears: tests/integration/test_standalone.py reads the task log over the REST API while
the task is deferred, then releases the job."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator


def ticker(release: str, limit: int = 1200) -> int:
    """Tick until ``release`` exists (at most ``limit`` ticks); return the tick count."""
    import os
    import time

    for i in range(limit):
        print(f"tick {i}", flush=True)
        if os.path.exists(release):
            return i + 1
        time.sleep(0.5)
    return limit


with DAG(
    "kinetic_live",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(
        task_id="tick",
        python_callable=ticker,
        op_args=["{{ dag_run.conf['release'] }}"],
        deferrable=True,
        poll_interval=1.0,
    )
