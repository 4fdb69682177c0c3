"""DAGs whose remote function raises an exception the client cannot rebuild.

``TwoArgError`` takes two arguments but, like every exception, pickles only its
``args`` (the one formatted message), so unpickling it calls ``TwoArgError(msg)``
and fails.  Exercised by tests/integration/core/jobs/test_remote_errors.py: the error must
still arrive with its type name, message and remote traceback.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.operators.map import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


class TwoArgError(Exception):
    """An exception whose constructor does not take its own ``args`` back."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code


def raise_two_arg(n: int) -> int:
    """Raises TwoArgError for odd inputs (every input when run as a single task)."""
    if n % 2:
        raise TwoArgError(f"E{n}", "the disk is on fire")
    return n * 10


with DAG("kinetic_edge_errors_run", schedule=None, start_date=START, catchup=False) as run_dag:
    KineticRunOperator(
        task_id="deferred",
        python_callable=raise_two_arg,
        op_args=[41],
        deferrable=True,
        poll_interval=0.2,
    )
    KineticRunOperator(
        task_id="sync",
        python_callable=raise_two_arg,
        op_args=[43],
        deferrable=False,
        poll_interval=0.2,
    )

with DAG("kinetic_edge_errors_map", schedule=None, start_date=START, catchup=False) as map_dag:
    KineticMapOperator(
        task_id="sweep",
        python_callable=raise_two_arg,
        inputs=[0, 1, 2, 3],
        max_concurrent=4,
        return_exceptions=True,
        deferrable=False,
        poll_interval=0.2,
    )
