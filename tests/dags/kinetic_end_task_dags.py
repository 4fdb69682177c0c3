"""Deferrable jobs whose task ends in the trigger (issue 46): ``train`` succeeds and
nothing must run on a worker after it (``output_asset=False``), so its trigger ends the
task with the job's value; ``flaky`` fails its first job, which resumes on a worker and
is retried there, then its second job's trigger ends the task; ``sweep``'s batch trigger
ends its map task with the children's values.  Each job waits for the run's release
file, so each task defers first.  ``use`` and ``total`` are plain tasks downstream of
the values.  tests/integration/test_standalone.py runs it."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator


def trained(release: str) -> dict:
    """Wait for ``release``; a small JSON value (its progress reported on the way)."""
    import os
    import time

    from airflow_provider_kinetic import progress

    progress.update(1, total=2, metrics={"loss": 0.5})
    while not os.path.exists(release):
        time.sleep(0.1)
    progress.update(2, total=2, metrics={"loss": 0.25})
    return {"answer": 42, "loss": [0.5, 0.25]}


def squared(x: int, release: str) -> int:
    """Wait for ``release``; ``x`` squared."""
    import os
    import time

    while not os.path.exists(release):
        time.sleep(0.1)
    return x * x


def fails_once(release: str, marker: str) -> str:
    """Wait for ``release``; the first execution fails, the second returns."""
    import os
    import time

    while not os.path.exists(release):
        time.sleep(0.1)
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("the first execution fails")
    return "second execution"


with DAG(
    "kinetic_end_task",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
) as dag:
    train = KineticRunOperator(
        task_id="train",
        python_callable=trained,
        op_args=["{{ dag_run.conf['release'] }}"],
        deferrable=True,
        output_asset=False,
        poll_interval=0.5,
    )
    KineticRunOperator(
        task_id="flaky",
        python_callable=fails_once,
        op_args=["{{ dag_run.conf['release'] }}", "{{ dag_run.conf['marker'] }}"],
        deferrable=True,
        output_asset=False,
        poll_interval=0.5,
        retries=1,
        retry_delay=pendulum.duration(seconds=0),
    )

    sweep = KineticMapOperator(
        task_id="sweep",
        python_callable=squared,
        inputs=[1, 2, 3],
        op_kwargs={"release": "{{ dag_run.conf['release'] }}"},
        deferrable=True,
        output_asset=False,
        poll_interval=0.5,
    )

    @task
    def use(value: dict) -> int:
        return value["answer"] + 1

    @task
    def total(values: list) -> int:
        return sum(values)

    use(train.output)
    total(sweep.output)
