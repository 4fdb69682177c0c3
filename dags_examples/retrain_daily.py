"""Daily retraining on the kinetic local backend (or GKE, given a kinetic connection).

make_dataset writes a small synthetic regression set for the run's ``ds``;
``train`` runs remotely through the kinetic protocol (deferrable): it receives the
dataset as a plain local path (``Data``), trains a small torch model on CPU, writes
a checkpoint and ``metrics.json`` to ``KINETIC_OUTPUT_DIR`` and returns the metrics;
check_outputs reads the ``output_dir`` URI from XCom and verifies the files.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticRunOperator

DATA_ROOT = os.environ.get("KINETIC_EXAMPLE_DATA_ROOT", "/tmp/kinetic-example/data")


def train_fn(data: str, epochs: int = 200, lr: float = 0.05) -> dict:
    """Fit y = Xw + b on the CSV shards in ``data``; save model + metrics."""
    import csv
    import glob
    import json
    import os

    import torch

    rows = []
    for path in sorted(glob.glob(os.path.join(data, "*.csv"))):
        with open(path) as f:
            rows += [[float(v) for v in r] for r in csv.reader(f)]
    table = torch.tensor(rows)
    x, y = table[:, :-1], table[:, -1:]
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    first = None
    for epoch in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if first is None:
            first = loss.item()
        if epoch % 50 == 0:
            print(f"epoch {epoch}: loss {loss.item():.5f}", flush=True)
    metrics = {
        "rows": len(rows),
        "epochs": epochs,
        "initial_loss": first,
        "final_loss": float(loss.item()),
    }
    out = os.environ["KINETIC_OUTPUT_DIR"]
    if out.startswith("gs://"):  # on GKE the output dir is a GCS prefix
        from google.cloud import storage

        bucket, _, prefix = out[len("gs://") :].partition("/")
        blob_dir = storage.Client().bucket(bucket)
        local = "/tmp/kinetic-out"
        os.makedirs(local, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(local, "model.pt"))
        blob_dir.blob(f"{prefix}/model.pt").upload_from_filename(os.path.join(local, "model.pt"))
        blob_dir.blob(f"{prefix}/metrics.json").upload_from_string(json.dumps(metrics))
    else:
        os.makedirs(out, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(out, "model.pt"))
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump(metrics, f)
    return metrics


with DAG(
    dag_id="retrain_daily",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example"],
) as dag:

    @task
    def make_dataset(ds: str | None = None) -> str:
        """Synthetic y = 3*x0 - 2*x1 + 0.5 + noise, in two CSV shards for this ds."""
        import random

        target = os.path.join(DATA_ROOT, ds)
        os.makedirs(target, exist_ok=True)
        rng = random.Random(ds)
        for shard in range(2):
            with open(os.path.join(target, f"part-{shard}.csv"), "w") as f:
                for _ in range(256):
                    x0, x1 = rng.uniform(-1, 1), rng.uniform(-1, 1)
                    y = 3 * x0 - 2 * x1 + 0.5 + rng.gauss(0, 0.05)
                    f.write(f"{x0:.6f},{x1:.6f},{y:.6f}\n")
        return target

    train = KineticRunOperator(
        task_id="train",
        python_callable=train_fn,
        op_kwargs={"data": Data(DATA_ROOT + "/{{ ds }}/"), "epochs": 200},
        accelerator="cpu",
        deferrable=True,
        poll_interval=1.0,
    )

    @task
    def check_outputs(metrics: dict, ti=None) -> dict:
        """Read the output dir URI from XCom and verify the training artefacts."""
        import json

        output_dir = ti.xcom_pull(task_ids="train", key="output_dir")

        from airflow_provider_kinetic.core.storage import store_for_uri

        store, key = store_for_uri(output_dir)
        names = sorted(k[len(key) + 1 :] for k in store.list(key + "/"))
        missing = {"model.pt", "metrics.json"} - set(names)
        if missing:
            raise ValueError(f"{output_dir} lacks {sorted(missing)}; found {names}")
        written = json.loads(store.read_bytes(key + "/metrics.json"))
        if written != metrics:
            raise ValueError(f"metrics.json {written} != returned metrics {metrics}")
        print(f"METRICS {json.dumps(metrics, sort_keys=True)}")
        print(f"OUTPUT_DIR {output_dir} files={names}")
        return {"files": names, **metrics}

    make_dataset() >> train
    check_outputs(train.output)
