"""Asset DAGs exercised by tests/integration/operators/test_assets.py."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Asset, AssetAlias

from airflow_provider_kinetic import Data, KineticRunOperator
from airflow_provider_kinetic.operators.map import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
SCRATCH = os.environ.get("KINETIC_TEST_SCRATCH", "/tmp/kinetic-test-scratch")
#: Made by the test before the inlet DAG runs (Data paths must exist at submit).
ASSET_IN = Asset(f"file://{SCRATCH}/asset-in")
SCHEDULED = Asset(f"file://{SCRATCH}/scheduled-in")
DECLARED = Asset("file:///declared/model")


def metrics(n: int = 3) -> dict:
    """A small JSON value: the event's extra carries it."""
    return {"loss": 0.25, "n": n}


def writes_model() -> dict:
    """A file in its output dir (what ``output_key`` publishes) and a small value."""
    import os

    with open(os.path.join(os.environ["KINETIC_OUTPUT_DIR"], "model.txt"), "w") as f:
        f.write("weights")
    return {"loss": 0.25, "n": 1}


def big() -> list[int]:
    """More than 4 KiB of JSON: the extra leaves it out."""
    return list(range(5000))


def count_files(a: str, b: str) -> int:
    import os

    return len(os.listdir(a)) + len(os.listdir(b))


def square(i: int) -> int:
    return i * i


with DAG("kinetic_asset_emit", schedule=None, start_date=START, catchup=False) as emit:
    KineticRunOperator(task_id="train", python_callable=metrics, poll_interval=0.2)
    KineticRunOperator(task_id="big", python_callable=big, poll_interval=0.2)
    KineticRunOperator(
        task_id="quiet", python_callable=metrics, poll_interval=0.2, output_asset=False
    )
    KineticRunOperator(
        task_id="keyed", python_callable=writes_model, poll_interval=0.2, output_key="assets/keyed"
    )

with DAG("kinetic_asset_declared", schedule=None, start_date=START, catchup=False) as declared:
    KineticRunOperator(
        task_id="train",
        python_callable=metrics,
        poll_interval=0.2,
        outlets=[DECLARED, AssetAlias("my-models")],
    )

with DAG("kinetic_asset_inlets", schedule=[SCHEDULED], start_date=START, catchup=False) as inlets:
    KineticRunOperator(
        task_id="use",
        python_callable=count_files,
        # An asset, and a URI the DAG's schedule declares (trailing "/" and all).
        op_kwargs={"a": Data(ASSET_IN), "b": Data(SCHEDULED.uri + "/")},
        poll_interval=0.2,
    )

with DAG("kinetic_asset_map", schedule=None, start_date=START, catchup=False) as batch:
    KineticMapOperator(task_id="sweep", python_callable=square, inputs=[1, 2, 3], poll_interval=0.2)
