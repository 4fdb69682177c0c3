"""A hyper-parameter sweep: one KineticMapOperator task runs a child job per learning
rate (at most 3 at once), and a plain task picks the best result."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticMapOperator


def fit(lr: float, steps: int = 100) -> dict:
    """Gradient descent on y = 2x + 1 with this learning rate; returns its final loss."""
    xs = [i / 50 - 1 for i in range(100)]
    ys = [2 * x + 1 for x in xs]
    w = b = 0.0
    for _ in range(steps):
        gw = sum((w * x + b - y) * x for x, y in zip(xs, ys, strict=True)) * 2 / len(xs)
        gb = sum(w * x + b - y for x, y in zip(xs, ys, strict=True)) * 2 / len(xs)
        w, b = w - lr * gw, b - lr * gb
    loss = sum((w * x + b - y) ** 2 for x, y in zip(xs, ys, strict=True)) / len(xs)
    return {"lr": lr, "loss": loss}


with DAG(
    dag_id="lr_sweep",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example"],
) as dag:
    sweep = KineticMapOperator(
        task_id="sweep",
        python_callable=fit,
        inputs=[{"lr": lr} for lr in (0.001, 0.01, 0.1, 0.5)],
        op_kwargs={"steps": 100},
        max_concurrent=3,
        poll_interval=0.5,
    )

    @task
    def pick_best(results: list[dict]) -> dict:
        best = min(results, key=lambda r: r["loss"])
        print(f"BEST {best}")
        return best

    pick_best(sweep.output)
