"""DAGs for tests/integration/test_first_hour.py: what a user writes in the first hour
(a ``functools.partial`` or bound method as the callable, a deferred task on the
local backend, ``default_args={"retries": ...}`` with a KineticMapOperator)."""

from __future__ import annotations

import functools
import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.operators.map import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
SCRATCH = os.environ.get("KINETIC_TEST_SCRATCH", "/tmp/kinetic-test-scratch")


#: A job of the callables DAG holds until its test releases it (``release_dir`` in the
#: run's conf; tests/fixtures/deferral.py releases each task as it defers), so it
#: surely defers: a job that ended before the operator's first look is collected at once.
RELEASE = (
    "{% if dag_run.conf.get('release_dir') %}"
    "{{ dag_run.conf['release_dir'] }}/{{ ti.task_id }}{% endif %}"
)


def held(release: str) -> None:
    """Wait (at most 20 minutes) until ``release`` exists; no hold when it is empty."""
    import os
    import time

    for _ in range(2400):
        if not release or os.path.exists(release):
            return
        time.sleep(0.5)


def add(a: int, b: int, *, c: int = 0, release: str = "") -> int:
    held(release)
    return a + b + c


class Greeter:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    def greet(self, name: str, release: str = "") -> str:
        held(release)
        return f"{self.greeting}, {name}"


def fails_first_time(i: int, tag: str) -> int:
    """Fails on its first attempt per input (a marker file remembers), then -i."""
    import os

    marker = os.path.join(os.environ["KINETIC_TEST_SCRATCH"], f"first-hour-{tag}-{i}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"transient failure of {i}")
    return -i


with DAG("kinetic_first_hour_callables", schedule=None, start_date=START, catchup=False) as dag:
    KineticRunOperator(
        task_id="partial_add",
        python_callable=functools.partial(add, 40, c=0),
        op_args=[2],
        op_kwargs={"release": RELEASE},
        deferrable=True,
        poll_interval=0.2,
    )
    KineticRunOperator(
        task_id="bound_greet",
        python_callable=Greeter("hello").greet,
        op_args=["kinetic"],
        op_kwargs={"release": RELEASE},
        deferrable=True,
        poll_interval=0.2,
    )

with DAG(
    "kinetic_first_hour_map_retries",
    schedule=None,
    start_date=START,
    catchup=False,
    default_args={"retries": 2},  # the task's Airflow retries, as on every operator
) as map_dag:
    KineticMapOperator(
        task_id="sweep",
        python_callable=fails_first_time,
        inputs=[1, 2, 3],
        op_kwargs={"tag": "map-retries"},
        capture_env_vars=["KINETIC_TEST_SCRATCH"],
        input_retries=1,  # each input once more: the batch succeeds in one try
        deferrable=True,
        poll_interval=0.2,
    )


def blob_size(blob: str) -> int:
    return len(blob)


# 2 MiB of op_kwargs: over a cap the test sets to 1 MiB ([kinetic] max_payload_mb).
BIG = {"blob": "x" * (2 * 2**20)}

with DAG("kinetic_first_hour_big_kwargs", schedule=None, start_date=START, catchup=False) as big:
    KineticRunOperator(task_id="run", python_callable=blob_size, op_kwargs=BIG)
    KineticMapOperator(
        task_id="sweep", python_callable=blob_size, inputs=[{}], op_kwargs=BIG, deferrable=True
    )
