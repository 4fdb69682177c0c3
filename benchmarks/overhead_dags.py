"""DAGs timed by ``benchmarks/cases_overhead.py`` (copied into a private DAGs folder).

One task per DAG, so each ``dag.test()`` run times one kind of task and nothing else;
the functions are trivial so that what is measured is the task's machinery.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def one() -> int:
    """The trivial function: what is left of the task time is overhead."""
    return 1


def seven_seconds() -> int:
    """Long enough that a deferrable task really defers (``DEFER_GRACE_S`` is 5 s)."""
    import time

    time.sleep(7.0)
    return 1


with DAG("overhead_plain", schedule=None, start_date=START, catchup=False) as plain_dag:

    @task
    def plain() -> int:
        return 1

    plain()

with DAG("overhead_plain_7s", schedule=None, start_date=START, catchup=False) as plain_7s_dag:

    @task
    def plain_7s() -> int:
        return seven_seconds()

    plain_7s()

with DAG("overhead_sync", schedule=None, start_date=START, catchup=False) as sync_dag:
    KineticRunOperator(task_id="job", python_callable=one, deferrable=False)

with DAG("overhead_deferrable", schedule=None, start_date=START, catchup=False) as deferrable_dag:
    KineticRunOperator(task_id="job", python_callable=one, deferrable=True)

with DAG("overhead_deferred_7s", schedule=None, start_date=START, catchup=False) as deferred_7s_dag:
    KineticRunOperator(task_id="job", python_callable=seven_seconds, deferrable=True)
