"""Training that survives preemption: periodic checkpoints in ``KINETIC_CHECKPOINT_DIR``.

``train`` fits a small linear model with full-batch gradient descent (numpy) for
``steps`` steps.  Every ``every`` steps it saves its state (the step and the weights)
to ``$KINETIC_CHECKPOINT_DIR/state.npz``, written under a ``.tmp`` name and renamed,
so a sync never reads half a file; at start it loads that file when there is one and
continues after the saved step.  The runner restores the directory before the
function starts and saves it every ``checkpoint_sync_s`` (60 s by default), on
SIGTERM (a spot VM's preemption notice) and at exit, so an attempt resubmitted after a
preemption (``preemption_retries``), an Airflow retry or a clear picks up where the
last save left off; ``KINETIC_ATTEMPT`` says which attempt this is.  Gradient descent
here is deterministic, so a resumed run ends with the same weights as an
uninterrupted one.  ``check`` fails the run unless the model converged.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator


def train(steps: int = 60, every: int = 2, step_s: float = 0.05, lr: float = 0.1) -> dict:
    """``steps`` steps of gradient descent, resumable from the last saved step."""
    import os
    import time

    import numpy as np

    folder = os.environ["KINETIC_CHECKPOINT_DIR"]
    attempt = int(os.environ["KINETIC_ATTEMPT"])
    path = os.path.join(folder, "state.npz")
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(256, 3)), np.ones((256, 1))])
    y = x @ np.array([2.0, -1.0, 0.5, 0.3])
    w, done = np.zeros(4), 0
    if os.path.exists(path):
        with np.load(path) as saved:
            w, done = saved["w"], int(saved["step"])
        print(f"attempt {attempt}: resuming after step {done}", flush=True)
    else:
        print(f"attempt {attempt}: starting", flush=True)
    resumed_from = done
    for step in range(done + 1, steps + 1):
        w = w - lr * 2 * x.T @ (x @ w - y) / len(x)
        time.sleep(step_s)  # stands in for the real work of a step
        print(f"attempt {attempt} step {step}", flush=True)
        if step % every == 0 or step == steps:
            with open(path + ".tmp", "wb") as f:  # whole, or not there at all
                np.savez(f, w=w, step=step)
            os.replace(path + ".tmp", path)
            print(f"attempt {attempt} saved step {step}", flush=True)
    loss = float(np.mean((x @ w - y) ** 2))
    return {"attempt": attempt, "resumed_from": resumed_from, "loss": loss, "w": w.tolist()}


with DAG(
    dag_id="checkpoint_resume",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example"],
) as dag:
    trained = KineticRunOperator(
        task_id="train",
        python_callable=train,
        accelerator="tpu-v5e-8",
        spot=True,  # cheaper, and may be reclaimed: the checkpoints make that cheap too
        preemption_retries=3,
        checkpoint_sync_s=60,  # the default; smaller loses less work on a hard kill
        poll_interval=0.5,
    )

    @task
    def check(result: dict) -> dict:
        if result["loss"] > 1e-3:
            raise ValueError(f"did not converge: {result}")
        return result

    check(trained.output)
