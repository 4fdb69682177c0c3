"""Daily training that publishes its model as a key and an Airflow asset event.

``train`` is an ordinary ``KineticRunOperator`` with ``output_key``: each successful
run makes its output dir the key's new version (``kinetic://models/asset_train`` reads
it) and adds one asset event through the alias ``kinetic:asset_train/train``, for
the task's stable asset ``x-kinetic-task://asset_train/train`` (both declared when
the file is parsed: runs add events, never assets).  The event's extra carries the
run's dir (``output_dir``), the job id, the accelerator, the key's ``version`` and the
function's small JSON return value (the metrics).  ``asset_evaluate.py`` is scheduled
on that alias and evaluates each model dir it is told about.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

TRUE_W, TRUE_B = (3.0, -2.0), 0.5


def train_fn(ds: str, rows: int = 200, epochs: int = 200, lr: float = 0.1) -> dict:
    """Fit y = w.x + b on this date's synthetic rows; write model.json to the output dir."""
    import json
    import random

    rng = random.Random(ds)
    data = []
    for _ in range(rows):
        x0, x1 = rng.uniform(-1, 1), rng.uniform(-1, 1)
        data.append((x0, x1, TRUE_W[0] * x0 + TRUE_W[1] * x1 + TRUE_B + rng.gauss(0, 0.05)))
    w, b = [0.0, 0.0], 0.0
    for _ in range(epochs):
        gw0 = sum((w[0] * x0 + w[1] * x1 + b - y) * x0 for x0, x1, y in data) / rows
        gw1 = sum((w[0] * x0 + w[1] * x1 + b - y) * x1 for x0, x1, y in data) / rows
        gb = sum(w[0] * x0 + w[1] * x1 + b - y for x0, x1, y in data) / rows
        w, b = [w[0] - 2 * lr * gw0, w[1] - 2 * lr * gw1], b - 2 * lr * gb
    model = {"ds": ds, "w": w, "b": b, "rows": rows}
    out = os.environ["KINETIC_OUTPUT_DIR"]
    if out.startswith("gs://"):  # on GKE the output dir is a GCS prefix
        from google.cloud import storage

        bucket, _, prefix = out[len("gs://") :].partition("/")
        blob = storage.Client().bucket(bucket).blob(f"{prefix.rstrip('/')}/model.json")
        blob.upload_from_string(json.dumps(model))
    else:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "model.json"), "w") as f:
            json.dump(model, f)
    return {"ds": ds, "w": [round(v, 4) for v in w], "b": round(b, 4)}  # the event's "value"


with DAG(
    dag_id="asset_train",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example", "assets"],
) as dag:
    KineticRunOperator(
        task_id="train",
        python_callable=train_fn,
        op_kwargs={"ds": "{{ ds }}"},
        output_key="models/asset_train",
        poll_interval=0.5,
    )
