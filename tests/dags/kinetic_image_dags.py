"""DAGs exercised by tests/integration/gcp/test_gke_bundled_image.py: a GKE job in a bundled
image (no ``image`` on the connection ``kinetic_gke_bundled``, set by the test)."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

#: Given explicitly (discovery would depend on where the DAGs folder lives); the jax
#: line is dropped (the image installs JAX for its accelerator).
REQUIREMENTS = ["six>=1.16", "jax==0.4.30"]


def image_seen() -> dict:
    """What the 'pod' saw: its job id."""
    import os

    return {"job_id": os.environ["JOB_ID"]}


with DAG(
    "kinetic_gke_bundled",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    KineticRunOperator(
        task_id="in_bundled_image",
        python_callable=image_seen,
        kinetic_conn_id="kinetic_gke_bundled",
        requirements=REQUIREMENTS,
        poll_interval=0.1,
    )
