"""Two deferrable sweeps for tests/integration/test_sweep_standalone.py, run together
by a real ``airflow standalone``: children longer than the operator's watch (so the
batches defer), of different lengths, each printing a numbered line a second and
recording when it held its slot."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
INPUTS = 6


def talk(sweep: str, i: int, seconds: int) -> int:
    """``seconds`` numbered lines, one a second; its start and end in its output dir."""
    import json
    import os
    import time

    start = time.time()
    for j in range(seconds):
        print(f"{sweep} child {i} line {j:02d}", flush=True)
        time.sleep(1)
    with open(os.path.join(os.environ["KINETIC_OUTPUT_DIR"], "times.json"), "w") as f:
        json.dump({"start": start, "end": time.time()}, f)
    return i


for name in ("a", "b"):
    with DAG(f"kinetic_sweep_{name}", schedule=None, start_date=START, catchup=False) as dag:
        KineticMapOperator(
            task_id="sweep",
            python_callable=talk,
            inputs=[{"sweep": name, "i": i, "seconds": 8 + i % 3} for i in range(INPUTS)],
            max_concurrent=2,
            poll_interval=1.0,
            deferrable=True,
        )
    globals()[f"sweep_{name}"] = dag
