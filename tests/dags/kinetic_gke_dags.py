"""DAGs exercised by tests/integration/core/backends/k8s/test_gke_dags.py against the
loopback API double.

Each DAG comes in a ``sync`` and a ``deferrable`` flavour.  The connections
(``kinetic_gke``, ``kinetic_gke_pull``) are set by the test through
``AIRFLOW_CONN_*`` environment variables, so this file needs no cluster to import.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
MODES = {"sync": False, "deferrable": True}


def gke_steps(n: int) -> dict:
    """Prints a few log lines (the pod's stdout) and returns what the pod saw."""
    import os

    job = os.environ["JOB_ID"]
    for step in range(1, 4):
        print(f"gke step {step}/3 of {job}", flush=True)
    return {
        "sum": sum(range(n)),
        "job_id": job,
        "bucket": os.environ["GCS_BUCKET"],
        "output_dir": os.environ["KINETIC_OUTPUT_DIR"],
    }


def gke_explodes(x: int) -> int:
    """Raises a recognisable error on the 'pod'."""
    raise ValueError(f"gke boom {x} from the pod")


for _mode, _deferrable in MODES.items():
    with DAG(f"kinetic_gke_ok_{_mode}", schedule=None, start_date=START, catchup=False) as _dag:
        KineticRunOperator(
            task_id="steps",
            python_callable=gke_steps,
            op_args=[10],
            kinetic_conn_id="kinetic_gke",
            deferrable=_deferrable,
            poll_interval=0.1,
            # sync keeps the artifacts so the test can rebuild the Job from them;
            # deferrable checks that they are cleaned up.
            cleanup="on_success" if _deferrable else "never",
        )
    globals()[_dag.dag_id] = _dag

    with DAG(f"kinetic_gke_fail_{_mode}", schedule=None, start_date=START, catchup=False) as _dag:
        KineticRunOperator(
            task_id="explode",
            python_callable=gke_explodes,
            op_args=[7],
            kinetic_conn_id="kinetic_gke",
            deferrable=_deferrable,
            poll_interval=0.1,
        )
    globals()[_dag.dag_id] = _dag

    with DAG(f"kinetic_gke_pull_{_mode}", schedule=None, start_date=START, catchup=False) as _dag:
        KineticRunOperator(
            task_id="pull",
            python_callable=gke_steps,
            op_args=[1],
            kinetic_conn_id="kinetic_gke_pull",
            deferrable=_deferrable,
            poll_interval=0.1,
        )
    globals()[_dag.dag_id] = _dag
