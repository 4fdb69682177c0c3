"""The map task the browser tests open on its task instance's Kinetic tab
(tests/integration/plugins/test_browser.py): three children that log a numbered line a
second for a while (each a progress step), so the tab is seen with children running,
their logs live and the batch's progress."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticMapOperator


def tick(i: int, seconds: int = 25) -> int:
    """Log ``seconds`` numbered lines, one a second, each a reported step."""
    import time

    from airflow_provider_kinetic import progress

    for j in range(seconds):
        print(f"batch child {i} line {j}", flush=True)
        progress.update(j + 1, total=seconds)
        time.sleep(1)
    return i


with DAG(
    "kinetic_browser_batch", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")
):
    KineticMapOperator(
        task_id="sweep", python_callable=tick, inputs=[0, 1, 2], max_concurrent=3,
        poll_interval=0.5,
    )  # fmt: skip
