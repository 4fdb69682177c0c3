"""JAX training sized for a TPU v5e-8 slice, writing a checkpoint to the output dir.

On GKE this runs on a ``tpu-v5e-8`` node (8 chips, one host) with ``JAX_PLATFORMS=tpu``;
on the embedded local backend the same job runs on this machine's CPU (the task log
says so), so the DAG can be developed on a laptop.  ``jax.jit`` compiles the step;
the checkpoint is an ``.npz`` of the parameters.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator


def train_linear(steps: int = 200, lr: float = 0.1) -> dict:
    import io
    import json
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.PRNGKey(0)
    kx, kn = jax.random.split(key)
    x = jax.random.uniform(kx, (1024, 2), minval=-1.0, maxval=1.0)
    y = x @ jnp.array([3.0, -2.0]) + 0.5 + 0.01 * jax.random.normal(kn, (1024,))
    params = {"w": jnp.zeros(2), "b": jnp.array(0.0)}

    def loss_fn(p: dict) -> jax.Array:
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    @jax.jit
    def step(p: dict) -> tuple[dict, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(p)
        return jax.tree_util.tree_map(lambda a, g: a - lr * g, p, grads), loss

    first = float(loss_fn(params))
    for _ in range(steps):
        params, loss = step(params)
    metrics = {
        "devices": [d.platform for d in jax.devices()],
        "initial_loss": first,
        "final_loss": float(loss),
        "w": [float(v) for v in params["w"]],
    }
    out = os.environ["KINETIC_OUTPUT_DIR"]
    buf = io.BytesIO()
    np.savez(buf, w=np.asarray(params["w"]), b=np.asarray(params["b"]))
    if out.startswith("gs://"):
        from google.cloud import storage

        bucket, _, prefix = out[len("gs://") :].partition("/")
        blobs = storage.Client().bucket(bucket)
        blobs.blob(f"{prefix.rstrip('/')}/checkpoint.npz").upload_from_string(buf.getvalue())
        blobs.blob(f"{prefix.rstrip('/')}/metrics.json").upload_from_string(json.dumps(metrics))
    else:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "checkpoint.npz"), "wb") as f:
            f.write(buf.getvalue())
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump(metrics, f)
    print(f"trained on {metrics['devices']}: loss {first:.4f} -> {metrics['final_loss']:.6f}")
    return metrics


with DAG(
    dag_id="jax_tpu_train",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["kinetic", "example", "jax"],
) as dag:
    train = KineticRunOperator(
        task_id="train",
        python_callable=train_linear,
        op_kwargs={"steps": 200},
        accelerator="tpu-v5e-8",
        deferrable=True,
        poll_interval=1.0,
    )

    @task
    def check(metrics: dict, ti=None) -> str:
        if metrics["final_loss"] > 0.01:
            raise ValueError(f"did not converge: {metrics}")
        return ti.xcom_pull(task_ids="train", key="output_dir")

    check(train.output)
