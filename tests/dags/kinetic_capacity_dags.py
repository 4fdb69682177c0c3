"""DAGs of tests/integration/operators/test_capacity_fallback.py (GKE API double, capacity chains).

A task asks for a reservation first, then spot; the test's kubelet leaves the
reservation's pod unschedulable, so the task must give that step up after
``capacity_wait`` and run on spot.  Sync and deferrable flavours.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def where_am_i() -> dict:
    """What the pod saw: which job ran the function (the test counts the runs)."""
    import os

    return {"job_id": os.environ["JOB_ID"], "attempt": os.environ.get("KINETIC_ATTEMPT")}


for _mode, _deferrable in {"sync": False, "deferrable": True}.items():
    with DAG(
        f"kinetic_capacity_fallback_{_mode}", schedule=None, start_date=START, catchup=False
    ) as _dag:
        KineticRunOperator(
            task_id="train",
            python_callable=where_am_i,
            accelerator="gpu-l4",
            capacity=["reservation:r1", "spot"],
            capacity_wait="{{ params.wait }}",
            params={"wait": 2},
            kinetic_conn_id="kinetic_gke",
            deferrable=_deferrable,
            poll_interval=0.2,
        )
    globals()[_dag.dag_id] = _dag

    with DAG(
        f"kinetic_capacity_queue_{_mode}", schedule=None, start_date=START, catchup=False
    ) as _dag:
        KineticRunOperator(
            task_id="train",
            python_callable=where_am_i,
            accelerator="gpu-l4",
            capacity="queue:team-a",
            priority_class="high",
            kinetic_conn_id="kinetic_gke",
            deferrable=_deferrable,
            poll_interval=0.2,
        )
    globals()[_dag.dag_id] = _dag
