"""DAGs the browser tests (tests/integration/plugins/test_browser.py) open in the Airflow UI:
one deferrable kinetic job that finishes at once with a few log lines and an output
file, and one that runs ~30 s so its task is seen deferred."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator


def greet(lines: int) -> int:
    """Log ``lines`` numbered lines and write one output file.

    It then stays up 10 s: a job that ends within a second of the deferral lets the
    trigger fire before the deferring worker has exited, and Airflow 3.3's scheduler
    then takes that worker's "success" event for the resumed try and fails the task
    (seen on a loaded 2-core machine; not what the browser tests are about)."""
    import os
    import time

    for i in range(lines):
        print(f"kinetic browser line {i}", flush=True)
    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(f"{lines} lines\n")
    time.sleep(10)
    return lines


def slow(seconds: int) -> int:
    """Run ``seconds`` seconds, logging a line a second (long enough to be seen deferred)
    and reporting its progress (the Kinetic tab's bar)."""
    import time

    from airflow_provider_kinetic import progress

    for i in range(seconds):
        print(f"slow tick {i}", flush=True)
        progress.update(i + 1, total=seconds, metrics={"tick": i})
        time.sleep(1)
    return seconds


START = pendulum.datetime(2026, 11, 1, tz="UTC")

with DAG("kinetic_browser_done", schedule=None, start_date=START, catchup=False):
    KineticRunOperator(
        task_id="greet", python_callable=greet, op_args=[5], deferrable=True, poll_interval=1.0
    )

with DAG("kinetic_browser_deferred", schedule=None, start_date=START, catchup=False):
    KineticRunOperator(
        task_id="slow", python_callable=slow, op_args=[30], deferrable=True, poll_interval=1.0
    )
