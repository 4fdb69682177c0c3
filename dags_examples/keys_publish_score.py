"""Train, publish the model under a key, score a batch that reads it by key.

``train`` is a ``KineticRunOperator`` with ``output_key``: when its job succeeds the
run's output dir becomes the key's new version (never on failure; retraining to the
same bytes makes no new version), and the new version is an asset event for
``kinetic://examples/churn-model`` (a DAG scheduled on that asset runs after it).

``score`` is a batch-inference ``KineticMapOperator`` whose shared ``Data`` is the key
itself, ``Data("kinetic://examples/churn-model")``: resolved when the batch is
submitted and pinned for this DAG run (a retry or a clear of ``score`` reads the same
version even after the key moved on; XCom ``kinetic_keys`` names it).  With
``broadcast=True`` the first child reads the model from the store and each later
child fetches it from a peer that already has it (a tree, every file hash-checked).

The model: y = w*x + b fitted on this date's synthetic rows.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticMapOperator, KineticRunOperator

MODEL_KEY = "examples/churn-model"
#: Rows to score, one batch child each (a real batch: shards of a table).
SHARDS = [[0.5, 1.0], [-1.0], [0.0, 0.2, -0.3]]


def train_fn(ds: str, rows: int = 500) -> dict:
    """Least squares for y = w*x + b on this date's synthetic rows (closed form); write
    ``model.json`` into the job's output dir (published under MODEL_KEY by
    ``output_key`` once the job has succeeded)."""
    import json
    import os
    import random

    rng = random.Random(ds)
    xs = [rng.uniform(-1, 1) for _ in range(rows)]
    ys = [1.5 * x - 0.25 + rng.gauss(0, 0.05) for x in xs]
    mx, my = sum(xs) / rows, sum(ys) / rows
    w = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    model = {"ds": ds, "w": w, "b": my - w * mx}
    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump(model, f)
    return {"ds": ds, "w": round(model["w"], 4), "b": round(model["b"], 4)}


def score_fn(xs: list, model: str) -> dict:
    """Score one shard with the model dir the batch shares (a plain local path)."""
    import json
    import os

    with open(os.path.join(model, "model.json")) as f:
        m = json.load(f)
    return {"model_ds": m["ds"], "predictions": [m["w"] * x + m["b"] for x in xs]}


with DAG(
    dag_id="keys_publish_score",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example", "keys"],
) as dag:
    train = KineticRunOperator(
        task_id="train",
        python_callable=train_fn,
        op_kwargs={"ds": "{{ ds }}"},
        output_key=MODEL_KEY,
        poll_interval=0.5,
    )
    score = KineticMapOperator(
        task_id="score",
        python_callable=score_fn,
        inputs=[{"xs": shard} for shard in SHARDS],
        op_kwargs={"model": Data(f"kinetic://{MODEL_KEY}")},
        broadcast=True,
        max_concurrent=3,
        poll_interval=0.5,
    )

    @task
    def report(results: list[dict]) -> int:
        """How many rows were scored (the task log shows each shard's predictions)."""
        for i, r in enumerate(results):
            print(f"shard {i}: model of {r['model_ds']}: {r['predictions']}")
        return sum(len(r["predictions"]) for r in results)

    train >> score
    report(score.output)
