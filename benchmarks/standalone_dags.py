"""DAGs timed by ``benchmarks/cases_standalone.py`` under ``airflow standalone`` (copied
into its DAGs folder): for each length, a deferred Kinetic job whose trigger ends the
task (``output_asset=False``: nothing runs on a worker after it), the same job resumed
on a worker (``output_asset=True``, the default: the task emits its asset event, so
the trigger's event is held, ``triggers.settle``), and Airflow's own deferral of that
length (``DateTimeSensorAsync``, its target rendered that long after the task starts)."""

from __future__ import annotations

import pendulum
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
#: The lengths timed, seconds.
LENGTHS = (7, 20)


def sleeps(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return 1


for length in LENGTHS:
    with DAG(f"bench_trigger_ends_{length}s", schedule=None, start_date=START, catchup=False):
        KineticRunOperator(
            task_id="job", python_callable=sleeps, op_args=[length], deferrable=True,
            output_asset=False,
        )  # fmt: skip
    with DAG(f"bench_worker_ends_{length}s", schedule=None, start_date=START, catchup=False):
        KineticRunOperator(task_id="job", python_callable=sleeps, op_args=[length], deferrable=True)
    with DAG(f"bench_airflow_{length}s", schedule=None, start_date=START, catchup=False):
        DateTimeSensorAsync(
            task_id="job",
            target_time="{{ macros.datetime.utcfromtimestamp(macros.time.time() + "
            + str(length)
            + ").isoformat() }}+00:00",
        )


def writes_model() -> int:
    """A job that leaves a small model in its output dir (what output_key publishes)."""
    import os

    with open(os.path.join(os.environ["KINETIC_OUTPUT_DIR"], "model.json"), "w") as f:
        f.write('{"w": 1}')
    return 1


# The step from a job's end to its task's end, with and without output_key (the key's
# put and its asset event; the google provider is installed, as in a real deployment).
with DAG("bench_end_step_key", schedule=None, start_date=START, catchup=False):
    KineticRunOperator(task_id="job", python_callable=writes_model, output_key="bench/model")
with DAG("bench_end_step_plain", schedule=None, start_date=START, catchup=False):
    KineticRunOperator(task_id="job", python_callable=writes_model)
