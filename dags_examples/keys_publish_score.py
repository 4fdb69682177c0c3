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

The model: y = w.x + b fitted on this date's synthetic rows (``asset_train.py``'s).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticMapOperator, KineticRunOperator

MODEL_KEY = "examples/churn-model"
#: Rows to score, one batch child each (a real batch: shards of a table).
SHARDS = [[[0.5, -0.5], [1.0, 1.0]], [[-1.0, 0.25]], [[0.0, 0.0], [0.2, 0.8], [-0.3, 0.1]]]


def train_fn(ds: str, rows: int = 200, epochs: int = 200, lr: float = 0.1) -> dict:
    """Fit the model and write ``model.json`` into the job's output dir (published
    under MODEL_KEY by ``output_key`` once the job has succeeded)."""
    import json
    import os
    import random

    rng = random.Random(ds)
    data = []
    for _ in range(rows):
        x0, x1 = rng.uniform(-1, 1), rng.uniform(-1, 1)
        data.append((x0, x1, 3.0 * x0 - 2.0 * x1 + 0.5 + rng.gauss(0, 0.05)))
    w, b = [0.0, 0.0], 0.0
    for _ in range(epochs):
        gw0 = sum((w[0] * x0 + w[1] * x1 + b - y) * x0 for x0, x1, y in data) / rows
        gw1 = sum((w[0] * x0 + w[1] * x1 + b - y) * x1 for x0, x1, y in data) / rows
        gb = sum(w[0] * x0 + w[1] * x1 + b - y for x0, x1, y in data) / rows
        w, b = [w[0] - 2 * lr * gw0, w[1] - 2 * lr * gw1], b - 2 * lr * gb
    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump({"ds": ds, "w": w, "b": b}, f)
    return {"ds": ds, "w": [round(v, 4) for v in w], "b": round(b, 4)}


def score_fn(rows: list, model: str) -> dict:
    """Score one shard with the model dir the batch shares (a plain local path)."""
    import json
    import os

    with open(os.path.join(model, "model.json")) as f:
        m = json.load(f)
    preds = [m["w"][0] * x0 + m["w"][1] * x1 + m["b"] for x0, x1 in rows]
    return {"model_ds": m["ds"], "predictions": [round(p, 4) for p in preds]}


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
        inputs=[{"rows": shard} for shard in SHARDS],
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
