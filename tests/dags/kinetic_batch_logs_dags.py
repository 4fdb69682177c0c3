"""Batch DAGs of tests/integration/operators/test_batch_logs.py: children's live logs in the
task log, and batches submitted now and waited for with KineticBatchSensor."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticBatchSensor, KineticMapOperator
from airflow_provider_kinetic.operators.common import DEFER_GRACE_S

START = pendulum.datetime(2026, 11, 1, tz="UTC")
LINES = 12


def chatty(i: int, quiet_s: float = 0.0) -> int:
    """Prints LINES numbered lines (a little apart, so several polls see them), after
    ``quiet_s`` of silence (longer than the operator's watch before it defers, so a
    deferrable batch's lines are shown by its trigger)."""
    import time

    time.sleep(quiet_s)
    for j in range(LINES):
        print(f"chatty {i}.{j:02d} " + "x" * 20, flush=True)
        time.sleep(0.02)
    return i * 10


def dies_talking(i: int) -> int:
    """Input 1 prints 30 lines of context and raises; the others succeed quietly."""
    if i == 1:
        for j in range(30):
            print(f"context 1.{j:02d}", flush=True)
        raise ValueError("child 1 gave up")
    return i


def square(i: int) -> int:
    return i * i


def odd_fails(i: int) -> int:
    if i % 2:
        raise RuntimeError(f"odd input {i}")
    return i


def _logs_dag(mode: str) -> DAG:
    with DAG(f"kinetic_batch_logs_{mode}", schedule=None, start_date=START, catchup=False) as dag:
        KineticMapOperator(
            task_id="sweep",
            python_callable=chatty,
            inputs=[0, 1, 2, 3],
            max_concurrent=2,
            child_log_bytes_per_poll=80,  # about two lines per child per poll
            poll_interval=0.2,
            deferrable=mode == "deferrable",
            op_kwargs={"quiet_s": DEFER_GRACE_S + 1 if mode == "deferrable" else 0.0},
        )
    return dag


def _sensor_dag(mode: str) -> DAG:
    with DAG(f"kinetic_batch_sensor_{mode}", schedule=None, start_date=START, catchup=False) as dag:
        submit = KineticMapOperator(
            task_id="submit",
            python_callable=square,
            inputs=list(range(5)),
            max_concurrent=2,  # the sensor launches the other three
            wait_for_completion=False,
        )
        wait = KineticBatchSensor(
            task_id="wait",
            batch=submit.output,
            return_result=True,
            mode="reschedule" if mode == "reschedule" else "poke",
            poke_interval=0.2,
            deferrable=mode == "deferrable",
        )
        submit >> wait
    return dag


logs_sync = _logs_dag("sync")
logs_deferrable = _logs_dag("deferrable")
sensor_poke = _sensor_dag("poke")
sensor_reschedule = _sensor_dag("reschedule")
sensor_deferrable = _sensor_dag("deferrable")

with DAG("kinetic_batch_logs_fail", schedule=None, start_date=START) as logs_fail:
    KineticMapOperator(
        task_id="sweep", python_callable=dies_talking, inputs=[0, 1, 2], poll_interval=0.2
    )

with DAG("kinetic_batch_logs_return_exc", schedule=None, start_date=START) as logs_return_exc:
    KineticMapOperator(
        task_id="sweep",
        python_callable=dies_talking,
        inputs=[0, 1, 2],
        poll_interval=0.2,
        return_exceptions=True,
    )

with DAG("kinetic_batch_sensor_fail", schedule=None, start_date=START) as sensor_fail:
    submit = KineticMapOperator(
        task_id="submit",
        python_callable=odd_fails,
        inputs=list(range(4)),
        max_concurrent=1,
        fail_fast=True,
        wait_for_completion=False,
    )
    submit >> KineticBatchSensor(
        task_id="wait", batch=submit.output, return_result=True, poke_interval=0.2
    )


def gke_chatty(i: int) -> int:
    """Five numbered lines on the 'pod'; input 2 then fails."""
    for j in range(5):
        print(f"gke child {i} line {j}", flush=True)
    if i == 2:
        raise ValueError("gke child 2 failed")
    return i


def _gke_dag(mode: str) -> DAG:
    """Run against the Kubernetes API double by tests/integration/operators/test_batch_logs_gke.py
    (the ``kinetic_gke`` connection is set by the test)."""
    with DAG(f"kinetic_batch_logs_gke_{mode}", schedule=None, start_date=START) as dag:
        KineticMapOperator(
            task_id="sweep",
            python_callable=gke_chatty,
            inputs=[0, 1, 2],
            max_concurrent=2,
            kinetic_conn_id="kinetic_gke",
            child_log_bytes_per_poll=40,
            poll_interval=0.1,
            deferrable=mode == "deferrable",
        )
    return dag


gke_sync = _gke_dag("sync")
gke_deferrable = _gke_dag("deferrable")
