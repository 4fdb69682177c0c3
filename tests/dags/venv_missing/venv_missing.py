"""A kinetic task whose requirements.txt names a package no index has: the local
backend's venv build fails with uv's resolver error in the task log, as the image
build would on GKE, and the job is never started."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator


def never_runs() -> int:
    return 1


with DAG(
    dag_id="kinetic_venv_missing",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(task_id="needs_missing", python_callable=never_runs)
