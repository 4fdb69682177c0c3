"""Submit now, wait later: three jobs start side by side, sensors wait for them and
return their results, a plain task combines them; a batch of the same function is
submitted the same way and waited for with one batch sensor.

``KineticRunOperator(wait_for_completion=False)`` returns the job's handle as soon as
the job exists; ``KineticJobSensor(return_result=True)`` waits (poke, reschedule or
deferrable) and returns the job's value.  The slot of the submitting task is free
while the jobs run.  ``KineticMapOperator(wait_for_completion=False)`` returns the
batch's handle once its first children run; ``KineticBatchSensor(return_result=True)``
launches the rest, shows the children's logs and returns the results in input order.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import (
    KineticBatchSensor,
    KineticJobSensor,
    KineticMapOperator,
    KineticRunOperator,
)


def evaluate(lr: float) -> dict:
    """A stand-in for an evaluation run: a loss that depends on the learning rate."""
    import time

    time.sleep(0.5)
    return {"lr": lr, "loss": round((lr - 0.03) ** 2 + 0.01, 6)}


with DAG(
    dag_id="submit_then_wait",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example"],
) as dag:
    results = []
    for name, lr, mode in (("a", 0.1, "poke"), ("b", 0.03, "reschedule"), ("c", 0.01, "poke")):
        submit = KineticRunOperator(
            task_id=f"submit_{name}",
            python_callable=evaluate,
            op_args=[lr],
            wait_for_completion=False,
        )
        wait = KineticJobSensor(
            task_id=f"wait_{name}",
            handle=submit.output,
            return_result=True,
            mode=mode,
            poke_interval=0.5,
            deferrable=name == "c",
        )
        submit >> wait
        results.append(wait.output)

    @task
    def pick_best(a: dict, b: dict, c: dict) -> dict:
        best = min((a, b, c), key=lambda r: r["loss"])
        print(f"BEST {best}")
        return best

    pick_best(*results)

    # The same sweep as one batch: submitted now, waited for by one (deferrable) sensor.
    submit_sweep = KineticMapOperator(
        task_id="submit_sweep",
        python_callable=evaluate,
        inputs=[0.1, 0.03, 0.01],
        max_concurrent=2,
        wait_for_completion=False,
    )
    wait_sweep = KineticBatchSensor(
        task_id="wait_sweep",
        batch=submit_sweep.output,
        return_result=True,
        poke_interval=0.5,
        deferrable=True,
    )
    submit_sweep >> wait_sweep

    @task
    def best_of_sweep(sweep: list[dict]) -> dict:
        return min(sweep, key=lambda r: r["loss"])

    best_of_sweep(wait_sweep.output)
