"""Evaluate every model ``asset_train`` publishes: a DAG scheduled on a Kinetic task's asset.

``asset_train``'s ``train`` task has one stable asset, ``task_asset("asset_train",
"train")``, and each successful run adds one event to it; this DAG is scheduled on
that asset (the alias ``kinetic:asset_train/train`` carries the same events).  Airflow
may hand one run several events (runs that ended close together, e.g. a backfill),
so ``trained_models`` lists them all and ``evaluate`` (dynamic task mapping) runs
one Kinetic job per model dir: ``Data(event.extra["output_dir"])`` arrives in the
job as a local directory, whatever the backend (the asset URI is the same dir as
Airflow normalises it, without the trailing ``/`` a gs:// directory needs).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticRunOperator, task_asset

#: ``x-kinetic-task://asset_train/train``: the train task's output, one event a run.
TRAINED = task_asset("asset_train", "train")


def evaluate_fn(model_dir: str, source_run_id: str) -> dict:
    """Score the model in ``model_dir`` on fresh held-out rows."""
    import json
    import random

    with open(os.path.join(model_dir, "model.json")) as f:
        model = json.load(f)
    rng = random.Random("held-out")
    w, b, sq = model["w"], model["b"], 0.0
    for _ in range(100):
        x0, x1 = rng.uniform(-1, 1), rng.uniform(-1, 1)
        y = 3.0 * x0 - 2.0 * x1 + 0.5
        sq += (w[0] * x0 + w[1] * x1 + b - y) ** 2
    print(f"model of {model['ds']} (run {source_run_id}): mse={sq / 100:.6f}", flush=True)
    return {"trained_ds": model["ds"], "source_run_id": source_run_id, "mse": sq / 100}


def as_kwargs(model: dict) -> dict:
    """One evaluation's arguments: the model dir as Data (a directory in the job)."""
    return {"model_dir": Data(model["model_dir"]), "source_run_id": model["source_run_id"]}


with DAG(
    dag_id="asset_evaluate",
    schedule=[TRAINED],
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example", "assets"],
) as dag:

    @task
    def trained_models(triggering_asset_events=None) -> list[dict]:
        """Each triggering event's model dir (none in a manual run)."""
        events = triggering_asset_events[TRAINED] if triggering_asset_events else []
        return [
            {"model_dir": e.extra["output_dir"], "source_run_id": e.source_run_id} for e in events
        ]

    KineticRunOperator.partial(
        task_id="evaluate", python_callable=evaluate_fn, poll_interval=0.5
    ).expand(op_kwargs=trained_models().map(as_kwargs))
