"""A task that reads a file next to its DAG and imports a package of its own.

This folder is the DAG's *project* (it holds ``requirements.txt``), so the job gets a
snapshot of it and runs with it as its working directory: ``assets/labels.txt``
opens by relative path in the pod as on the local backend.  ``tabulate`` comes from
``requirements.txt``: the job's image has it on GKE; the local backend builds a venv
with uv once and reuses it.  Only the kinetic task needs it, so it is imported inside
the function, never at parse time.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator


def label_report(title: str) -> dict:
    """Count the labels shipped next to the DAG and render them as a table."""
    import sys

    from tabulate import tabulate

    with open("assets/labels.txt") as f:
        labels = [line.strip() for line in f if line.strip()]
    table = tabulate([[i, name] for i, name in enumerate(labels)], headers=["id", title])
    return {
        "labels": labels,
        "table": table,
        "tabulate_from": sys.modules["tabulate"].__file__,
        "python": sys.executable,
    }


with DAG(
    dag_id="with_assets",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example"],
) as dag:
    report = KineticRunOperator(
        task_id="label_report",
        python_callable=label_report,
        op_kwargs={"title": "label"},
        # Scratch files in this folder stay out of the job (see also .kineticignore).
        context_excludes=["*.tmp"],
    )

    @task
    def show(result: dict) -> int:
        print(result["table"])
        return len(result["labels"])

    show(report.output)
