"""DAGs for tests/integration/core/jobs/test_tries.py: map retries, results that do not fit
XCom, preemption retries.  Functions count their executions in marker files."""

from __future__ import annotations

import datetime as dt
import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator, load_result

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def _count(name: str) -> int:
    """Append one line to a marker file in the scratch dir (the task captures its
    variable); return how many there are."""
    path = os.path.join(os.environ["KINETIC_TEST_SCRATCH"], name)
    with open(path, "a") as f:
        f.write("run\n")
    with open(path) as f:
        return f.read().count("run")


def flaky_child(i: int, tag: str) -> int:
    """Inputs 1 and 4 fail on their first execution; every execution is counted."""
    if _count(f"{tag}-{i}") == 1 and i in (1, 4):
        raise RuntimeError(f"input {i} fails on its first execution")
    return i * 10


class Point:
    """Not serialisable by Airflow: travels as a reference."""

    def __init__(self, x: float, y: float):
        self.x, self.y = x, y


def make_point() -> Point:
    return Point(3.0, 4.0)


def make_bytes() -> bytes:
    return b"k" * (3 * 1024 * 1024)  # over the 1 MiB default limit


def make_array():  # noqa: ANN201 - numpy in the job only
    import numpy as np

    return np.arange(12.0).reshape(3, 4)


def use_all(point: Point, blob: bytes, array) -> dict:  # noqa: ANN001
    return {"norm": (point.x**2 + point.y**2) ** 0.5, "bytes": len(blob), "sum": float(array.sum())}


def slow_answer(tag: str) -> int:
    import time

    _count(tag)
    time.sleep(2)  # long enough to be preempted before it can finish
    return 42


with DAG("kinetic_map_resume", schedule=None, start_date=START, catchup=False) as map_resume:
    KineticMapOperator(
        task_id="sweep",
        python_callable=flaky_child,
        inputs=list(range(6)),
        op_kwargs={"tag": "map-retry"},
        capture_env_vars=["KINETIC_TEST_SCRATCH"],
        max_concurrent=3,
        input_retries=0,  # per input: a failed child fails this try
        retries=1,  # the task's Airflow retry resumes the batch
        retry_delay=dt.timedelta(seconds=0),
        poll_interval=0.2,
        deferrable=False,
    )

with DAG("kinetic_big_results", schedule=None, start_date=START, catchup=False) as big_results:
    point = KineticRunOperator(task_id="point", python_callable=make_point, poll_interval=0.2)
    blob = KineticRunOperator(task_id="blob", python_callable=make_bytes, poll_interval=0.2)
    array = KineticRunOperator(task_id="array", python_callable=make_array, poll_interval=0.2)
    KineticRunOperator(
        task_id="use",
        python_callable=use_all,
        op_args=[point.output, blob.output, array.output],
        poll_interval=0.2,
    )

    @task
    def plain(point_ref: dict, blob_ref: dict, array_ref: dict) -> dict:
        p, b, a = load_result(point_ref), load_result(blob_ref), load_result(array_ref)
        return {"type": type(p).__name__, "x": p.x, "bytes": len(b), "shape": list(a.shape)}

    plain(point.output, blob.output, array.output)


def _preempt_dag(dag_id: str, deferrable: bool) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START, catchup=False) as dag:
        KineticRunOperator(
            task_id="answer",
            python_callable=slow_answer,
            op_args=[dag_id],
            capture_env_vars=["KINETIC_TEST_SCRATCH"],
            kinetic_conn_id="kinetic_preempt",
            preemption_retries=2,
            retries=0,  # a preemption must not need an Airflow retry
            poll_interval=0.2,
            deferrable=deferrable,
        )
    return dag


preempt_sync = _preempt_dag("kinetic_preempt_sync", deferrable=False)
preempt_deferred = _preempt_dag("kinetic_preempt_deferred", deferrable=True)


def chatty(n: int) -> int:
    import time

    for i in range(n):
        print(f"chatty line {i}", flush=True)
        time.sleep(0.5)
    return n


with DAG("kinetic_live_logs", schedule=None, start_date=START, catchup=False) as live_logs:
    KineticRunOperator(
        task_id="chatty", python_callable=chatty, op_args=[14], deferrable=True, poll_interval=0.2
    )
