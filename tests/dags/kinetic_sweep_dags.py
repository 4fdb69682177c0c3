"""Sweep DAGs of tests/integration/operators/test_sweep_gke_scale.py and test_sweep_standalone.py:
deferrable batches that the trigger drives to their end (one deferral per try)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def double(i: int) -> int:
    return 2 * i


with DAG("kinetic_sweep_gke_1000", schedule=None, start_date=START) as gke_1000:
    # Against the Kubernetes API double (the ``kinetic_gke`` connection is set by the
    # test, whose "kubelet" plays each child Job).
    KineticMapOperator(
        task_id="sweep",
        python_callable=double,
        inputs=list(range(int(os.environ.get("KINETIC_TEST_SWEEP_N", "1000")))),
        max_concurrent=64,
        kinetic_conn_id="kinetic_gke",
        child_log_bytes_per_poll=0,
        poll_interval=0.2,
        deferrable=True,
    )
