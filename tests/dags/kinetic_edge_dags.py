"""DAGs for tests/integration/operators/test_result_edges.py: results Airflow cannot store as
they are (NaN, large values of multiple_outputs) and a map over no inputs.  Functions
count their executions in marker files, in the scratch dir each task captures (a job
sees only the worker variables it captures)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator, load_result

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def _count(name: str) -> None:
    with open(os.path.join(os.environ["KINETIC_TEST_SCRATCH"], name), "a") as f:
        f.write("run\n")


def nan_metrics() -> dict:
    _count("edge-nan")
    return {"loss": float("nan"), "best": float("inf"), "acc": 0.5}


with DAG("kinetic_edge_nan", schedule=None, start_date=START, catchup=False) as edge_nan:
    metrics = KineticRunOperator(
        task_id="train",
        python_callable=nan_metrics,
        poll_interval=0.2,
        capture_env_vars=["KINETIC_TEST_SCRATCH"],
    )

    @task
    def report(ref: dict) -> dict:
        value = load_result(ref)
        return {"acc": value["acc"], "loss_is_nan": value["loss"] != value["loss"]}

    report(metrics.output)


with DAG("kinetic_edge_multi", schedule=None, start_date=START, catchup=False) as edge_multi:

    @task.kinetic(
        multiple_outputs=True, poll_interval=0.2, capture_env_vars=["KINETIC_TEST_SCRATCH"]
    )
    def split() -> dict:
        _count("edge-multi")
        return {"small": 3, "big": b"x" * (2 * 1024 * 1024), "name": "run"}

    @task
    def use(small: int, big: dict, name: str) -> dict:
        return {"small": small, "big": len(load_result(big)), "ref": sorted(big), "name": name}

    out = split()
    use(out["small"], out["big"], out["name"])


with DAG("kinetic_edge_empty_map", schedule=None, start_date=START, catchup=False) as empty_map:

    @task
    def nothing() -> list:
        return []

    def square(x: int) -> int:
        _count("edge-empty")
        return x * x

    sweep = KineticMapOperator(
        task_id="sweep",
        python_callable=square,
        inputs=nothing(),
        poll_interval=0.2,
        capture_env_vars=["KINETIC_TEST_SCRATCH"],
    )

    @task
    def after(values: list) -> int:
        return len(values)

    after(sweep.output)
