"""DAGs exercised by tests/integration/test_dags.py (copied into the test DAGs folder)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import Data, KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
DATA = os.environ.get("KINETIC_TEST_DATA", "/tmp/kinetic-test-data")


def fails_loudly(x: int) -> int:
    """Raises a recognisable error remotely."""
    raise ValueError(f"boom {x} from the remote side")


def nested_sum(cfg: dict, shards: list) -> dict:
    """Reads Data passed at depth inside dicts and lists, and a volume."""
    import os

    def read(path: str) -> str:
        return open(path).read().strip()

    return {
        "cfg": read(cfg["nested"][0]),
        "shards": [sorted(os.listdir(p)) for p in shards],
        "volume": sorted(os.listdir(os.environ["KINETIC_TEST_VOLUME"])),
        "output_dir": os.environ["KINETIC_OUTPUT_DIR"],
    }


with DAG("kinetic_fail", schedule=None, start_date=START, catchup=False) as fail_dag:
    KineticRunOperator(
        task_id="explode",
        python_callable=fails_loudly,
        op_args=[42],
        deferrable=True,
        poll_interval=0.2,
    )

with DAG("kinetic_sync_nested", schedule=None, start_date=START, catchup=False) as nested_dag:
    KineticRunOperator(
        task_id="nested",
        python_callable=nested_sum,
        op_kwargs={
            "cfg": {"nested": [Data(DATA + "/{{ ds }}/config.txt")]},
            "shards": (Data(DATA + "/shards/a/"), Data(DATA + "/shards/b")),
        },
        volumes={DATA + "/mnt-{{ ds }}": Data(DATA + "/shards/a/")},
        capture_env_vars=["KINETIC_TEST_VOLUME"],
        deferrable=False,
        poll_interval=0.2,
    )

with DAG("kinetic_bad_accelerator", schedule=None, start_date=START, catchup=False) as bad_dag:
    KineticRunOperator(
        task_id="bad",
        python_callable=fails_loudly,
        op_args=[1],
        accelerator="tpu-v9z-3",
    )


def _helper(n: int) -> int:
    return n * n


with DAG("kinetic_taskflow", schedule=None, start_date=START, catchup=False) as taskflow_dag:
    from airflow.sdk import task

    @task.kinetic(accelerator="gpu-l4", deferrable=True, poll_interval=0.2)
    def squares(n: int) -> dict:
        import os

        return {"sum": sum(_helper(i) for i in range(n)), "jax": os.environ["JAX_PLATFORMS"]}

    squares(10)


with DAG("kinetic_sensor", schedule=None, start_date=START, catchup=False) as sensor_dag:
    from airflow_provider_kinetic.sensors.job import KineticJobSensor

    ok = KineticRunOperator(task_id="ok", python_callable=_helper, op_args=[3], poll_interval=0.2)
    bad = KineticRunOperator(
        task_id="bad", python_callable=fails_loudly, op_args=[1], poll_interval=0.2
    )
    for upstream in (ok, bad):
        for mode, deferrable in (("poke", False), ("defer", True)):
            upstream >> KineticJobSensor(
                task_id=f"wait_{upstream.task_id}_{mode}",
                handle="{{ ti.xcom_pull(task_ids='" + upstream.task_id + "', key='kinetic_job') }}",
                deferrable=deferrable,
                poke_interval=0.2,
                trigger_rule="all_done",
            )
