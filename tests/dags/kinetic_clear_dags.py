"""A deferrable task whose first execution runs long: tests/integration/test_standalone.py
clears it over the REST API while it is deferred and expects one new job to succeed.
Nothing runs on a worker after its job (``output_asset=False``), so its trigger ends the
task (issue 46): a clear still cancels the old job and runs one new one."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator


def long_then_quick(marker: str) -> str:
    """The first execution runs for minutes (it will be cancelled); later ones return."""
    import time

    with open(marker, "a") as f:
        f.write("run\n")
    with open(marker) as f:
        n = f.read().count("run")
    if n == 1:
        time.sleep(300)
    return f"execution {n}"


with DAG(
    "kinetic_clear",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(
        task_id="work",
        python_callable=long_then_quick,
        op_args=["{{ dag_run.conf['marker'] }}"],
        deferrable=True,
        poll_interval=1.0,
        output_asset=False,
    )
