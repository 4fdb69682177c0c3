"""DAGs for tests/integration/operators/test_openlineage.py: what the OpenLineage events say.

The data lives under ``$KINETIC_TEST_DATA/lineage`` (the test writes it before running).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import (
    Data,
    KineticBatchSensor,
    KineticJobSensor,
    KineticMapOperator,
    KineticRunOperator,
)

START = pendulum.datetime(2026, 11, 1, tz="UTC")
DATA = os.path.join(os.environ.get("KINETIC_TEST_DATA", "/tmp/kinetic-test-data"), "lineage")


def train(data: str, cfg: dict) -> int:
    """Reads a directory and a nested file, writes a model to the output dir."""
    import os

    files = sorted(os.listdir(data))
    with open(cfg["nested"][0]) as f:
        lr = float(f.read())
    with open(os.path.join(os.environ["KINETIC_OUTPUT_DIR"], "model.txt"), "w") as f:
        f.write(f"{files} {lr}")
    return len(files)


def shard_size(shard: str) -> int:
    import os

    return len(os.listdir(shard))


def fails(x: int) -> int:
    raise ValueError(f"lineage boom {x}")


with DAG("kinetic_lineage_run", schedule=None, start_date=START, catchup=False) as run_dag:
    KineticRunOperator(
        task_id="train",
        python_callable=train,
        op_kwargs={"data": Data(DATA + "/train/"), "cfg": {"nested": [Data(DATA + "/lr.txt")]}},
        poll_interval=0.2,
    )

    @task.kinetic(poll_interval=0.2)
    def count(folder: str) -> int:
        import os

        return len(os.listdir(folder))

    count(Data(DATA + "/train"))


with DAG("kinetic_lineage_map", schedule=None, start_date=START, catchup=False) as map_dag:
    KineticMapOperator(
        task_id="sweep",
        python_callable=shard_size,
        inputs=[Data(DATA + "/shards/a/"), Data(DATA + "/shards/b/")],
        poll_interval=0.2,
    )


with DAG("kinetic_lineage_sensor", schedule=None, start_date=START, catchup=False) as sensor_dag:
    submit = KineticRunOperator(
        task_id="submit",
        python_callable=shard_size,
        op_args=[Data(DATA + "/shards/a")],
        wait_for_completion=False,
    )
    submit >> KineticJobSensor(
        task_id="wait",
        handle="{{ ti.xcom_pull(task_ids='submit', key='kinetic_job') }}",
        return_result=True,
        poke_interval=0.2,
    )
    submit_batch = KineticMapOperator(
        task_id="submit_batch",
        python_callable=shard_size,
        inputs=[Data(DATA + "/shards/b")],
        wait_for_completion=False,
    )
    submit_batch >> KineticBatchSensor(
        task_id="wait_batch",
        batch="{{ ti.xcom_pull(task_ids='submit_batch') }}",
        return_result=True,
        poke_interval=0.2,
    )


with DAG("kinetic_lineage_fail", schedule=None, start_date=START, catchup=False) as fail_dag:
    KineticRunOperator(task_id="bad", python_callable=fails, op_args=[7], poll_interval=0.2)
