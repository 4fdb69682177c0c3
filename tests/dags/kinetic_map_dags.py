"""Batch DAGs exercised by tests/integration/operators/test_map_dags.py."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.operators.map import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
SCRATCH = os.environ.get("KINETIC_TEST_SCRATCH", "/tmp/kinetic-test-scratch")
BAD = {5, 42, 77, 150}


def square_or_raise(i: int, offset: int = 0) -> int:
    """Raises for the inputs in BAD; else i*i + offset."""
    if i in BAD:
        raise ValueError(f"input {i} is bad")
    return i * i + offset


def fails_first_time(i: int) -> int:
    """Every tenth input fails on its first attempt only (a marker file remembers)."""
    import os

    marker = os.path.join(os.environ["KINETIC_TEST_SCRATCH"], f"attempt-{i}")
    if i % 10 == 3 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"transient failure of {i}")
    return -i


def slow_unless_two(i: int) -> int:
    """Input 2 fails at once; the others would run for a minute."""
    import os
    import time

    with open(os.path.join(os.environ["KINETIC_TEST_SCRATCH"], f"pid-{i}"), "w") as f:
        f.write(str(os.getpid()))
    if i == 2:
        raise RuntimeError("two fails fast")
    time.sleep(60)
    return i


def add(a: int, b: int = 100) -> int:
    return a + b


def _map(dag_id: str, **kwargs):
    with DAG(dag_id, schedule=None, start_date=START, catchup=False) as dag:
        KineticMapOperator(task_id="sweep", poll_interval=0.2, **kwargs)
    return dag


map_fail = _map(
    "kinetic_map_fail",
    python_callable=square_or_raise,
    inputs=list(range(200)),
    max_concurrent=4,
    op_kwargs={"offset": 1},
    deferrable=True,
)
map_return_exc = _map(
    "kinetic_map_return_exc",
    python_callable=square_or_raise,
    inputs=list(range(200)),
    max_concurrent=4,
    return_exceptions=True,
    deferrable=False,
)
map_retry = _map(
    "kinetic_map_retry",
    python_callable=fails_first_time,
    inputs=list(range(30)),
    max_concurrent=4,
    input_retries=1,
    capture_env_vars=["KINETIC_TEST_SCRATCH"],
    deferrable=True,
)
map_fail_fast = _map(
    "kinetic_map_fail_fast",
    python_callable=slow_unless_two,
    inputs=list(range(12)),
    max_concurrent=4,
    fail_fast=True,
    capture_env_vars=["KINETIC_TEST_SCRATCH"],
    deferrable=True,
)
map_empty = _map("kinetic_map_empty", python_callable=add, inputs=[], deferrable=True)

with DAG("kinetic_mapped_and_xcom", schedule=None, start_date=START, catchup=False) as mapped:

    @task
    def make_inputs() -> list:
        return [{"a": 1}, {"a": 2, "b": 3}, [4, 5], 6]

    KineticRunOperator.partial(
        task_id="each", python_callable=add, poll_interval=0.2, deferrable=True
    ).expand(op_args=[[1], [2], [3], [4], [5]])
    KineticMapOperator(
        task_id="from_xcom",
        python_callable=add,
        inputs=make_inputs(),
        poll_interval=0.2,
        deferrable=True,
    )
