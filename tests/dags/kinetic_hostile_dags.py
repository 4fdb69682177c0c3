"""A DAG for tests/integration/test_hostile_ids_standalone.py: non-ASCII task ids, run
under run ids with ``:``, ``+``, ``~``, spaces and non-ASCII.  Every job waits (with a
deadline) until the jobs of all runs have started, so they are all live at once: a job
adopted by another run shows as a run that never started its own."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
#: Runs the test triggers (x the two tasks): all their jobs overlap.
EXPECTED_JOBS = 6


def who(rid: str, task: str, barrier: str) -> dict:
    import json
    import os
    import time

    os.makedirs(barrier, exist_ok=True)
    with open(os.path.join(barrier, f"{os.getpid()}"), "w") as f:
        f.write(json.dumps([rid, task]))
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < EXPECTED_JOBS and time.monotonic() < deadline:
        time.sleep(0.1)
    out = os.environ["KINETIC_OUTPUT_DIR"]
    with open(os.path.join(out, "who.json"), "w") as f:
        json.dump([rid, task], f)
    return {"rid": rid, "task": task, "together": len(os.listdir(barrier)), "out": out}


with DAG(
    "kinetic_hostile_ids", schedule=None, start_date=START, catchup=False, max_active_runs=8
) as hostile:
    for task_id in ("训练", "学习"):
        KineticRunOperator(
            task_id=task_id,
            python_callable=who,
            op_kwargs={
                "rid": "{{ run_id }}",
                "task": "{{ task.task_id }}",
                "barrier": "{{ var.value.get('kinetic_barrier', '/nonexistent') }}",
            },
            poll_interval=0.5,
            cleanup="never",  # handles stay: `jobs list` reads them
        )
