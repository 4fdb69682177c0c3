"""Train, then evaluate the trained model, chained through the ``output_dir`` XCom.

``train`` writes ``model.json`` to its ``KINETIC_OUTPUT_DIR``.  ``evaluate`` receives
that directory as a plain local path by passing the exact ``output_dir`` XCom value
of ``train`` to ``Data`` (``file://...`` on the local backend, ``gs://.../`` on GKE):
no string editing, no download code in the function.  ``report`` is a plain task.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticRunOperator

DATA_ROOT = os.environ.get("KINETIC_EXAMPLE_DATA_ROOT", "/tmp/kinetic-example/data")
TRUE_W, TRUE_B = (3.0, -2.0), 0.5


def _rows(path: str) -> list[list[float]]:
    import csv

    with open(path) as f:
        return [[float(v) for v in row] for row in csv.reader(f)]


def _write_output(name: str, text: str) -> str:
    """Write one file into this job's output dir (a local path, or gs:// on GKE)."""
    out = os.environ["KINETIC_OUTPUT_DIR"]
    if out.startswith("gs://"):
        from google.cloud import storage

        bucket, _, prefix = out[len("gs://") :].partition("/")
        storage.Client().bucket(bucket).blob(f"{prefix.rstrip('/')}/{name}").upload_from_string(
            text
        )
        return f"{out.rstrip('/')}/{name}"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
    return os.path.join(out, name)


def train_fn(data: str, epochs: int = 300, lr: float = 0.1) -> dict:
    """Fit y = w.x + b by gradient descent (plain Python: starts in milliseconds)."""
    import json

    rows = _rows(os.path.join(data, "train.csv"))
    w, b = [0.0, 0.0], 0.0
    for _ in range(epochs):
        gw, gb = [0.0, 0.0], 0.0
        for x0, x1, y in rows:
            err = w[0] * x0 + w[1] * x1 + b - y
            gw[0] += err * x0
            gw[1] += err * x1
            gb += err
        n = len(rows)
        w = [w[0] - lr * 2 * gw[0] / n, w[1] - lr * 2 * gw[1] / n]
        b -= lr * 2 * gb / n
    model = {"w": w, "b": b, "rows": len(rows)}
    _write_output("model.json", json.dumps(model))
    print(f"trained on {len(rows)} rows: w={w} b={b:.4f}", flush=True)
    return model


def evaluate_fn(model_dir: str, data: str) -> dict:
    """Score the model found in ``model_dir`` on the held-out split."""
    import json

    with open(os.path.join(model_dir, "model.json")) as f:
        model = json.load(f)
    rows = _rows(os.path.join(data, "test.csv"))
    w, b = model["w"], model["b"]
    mse = sum((w[0] * x0 + w[1] * x1 + b - y) ** 2 for x0, x1, y in rows) / len(rows)
    print(f"evaluated {len(rows)} rows: mse={mse:.6f}", flush=True)
    return {"mse": mse, "rows": len(rows), "model_files": sorted(os.listdir(model_dir))}


with DAG(
    dag_id="train_evaluate",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example"],
) as dag:

    @task
    def make_splits(ds: str | None = None) -> str:
        """Synthetic y = 3*x0 - 2*x1 + 0.5 + noise: train.csv and test.csv for this ds."""
        import random

        target = os.path.join(DATA_ROOT, "train_evaluate", ds)
        os.makedirs(target, exist_ok=True)
        rng = random.Random(ds)
        for split, n in (("train", 400), ("test", 100)):
            with open(os.path.join(target, f"{split}.csv"), "w") as f:
                for _ in range(n):
                    x0, x1 = rng.uniform(-1, 1), rng.uniform(-1, 1)
                    y = TRUE_W[0] * x0 + TRUE_W[1] * x1 + TRUE_B + rng.gauss(0, 0.05)
                    f.write(f"{x0:.6f},{x1:.6f},{y:.6f}\n")
        return target

    split_dir = DATA_ROOT + "/train_evaluate/{{ ds }}/"
    train = KineticRunOperator(
        task_id="train",
        python_callable=train_fn,
        op_kwargs={"data": Data(split_dir)},
        poll_interval=0.5,
    )
    evaluate = KineticRunOperator(
        task_id="evaluate",
        python_callable=evaluate_fn,
        op_kwargs={
            # The exact XCom value of the upstream task: a directory on every backend.
            "model_dir": Data("{{ ti.xcom_pull(task_ids='train', key='output_dir') }}"),
            "data": Data(split_dir),
        },
        poll_interval=0.5,
    )

    @task
    def report(metrics: dict) -> dict:
        if metrics["mse"] > 0.01:
            raise ValueError(f"model too weak: {metrics}")
        print(f"EVAL {metrics}")
        return metrics

    make_splits() >> train >> evaluate
    report(evaluate.output)
