"""DAG exercised by tests/integration/core/keys/tensors/test_tensor_keys_gke.py: a task puts a state
dict under a key; a KineticMapOperator of 2 children on the GKE backend (the API
double, the real runner per child Job, fake-gcs-server) gets it by tensor broadcast.
The connection ``kinetic_gke`` is set by the test."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
KEY = "gke-tensors/model"


def state_dict(fill: bool) -> dict:
    import torch

    w, b = torch.zeros(16, 8), torch.zeros(16, dtype=torch.int64)
    if fill:
        w, b = torch.arange(128.0).reshape(16, 8) / 7, torch.arange(16) * 3
    return {"w": w, "b": b}


def digest(sd: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(sd):
        h.update(name.encode() + sd[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def receive(i: int) -> dict:
    """A child: counts its reads of the key's blob, gets by broadcast, checksums."""
    from airflow_provider_kinetic import BroadcastWindow, store
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    reads: list[str] = []
    real = GcsStore.download_prefix

    def counting(self, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(prefix)
        return real(self, prefix, *args, **kwargs)

    GcsStore.download_prefix = counting  # type: ignore[method-assign]
    dest = state_dict(fill=False)
    row = store.get(KEY, dest=dest, broadcast=BroadcastWindow(world_size=2, timeout=120))
    blob_reads = [p for p in reads if "data-cache" in p]
    return {"rank": row["rank"], "source": row["source"], "sum": digest(dest), "reads": blob_reads}


with DAG("kinetic_gke_tensors", schedule=None, start_date=START, catchup=False) as gke_tensor_dag:

    @task
    def publish() -> dict:
        from airflow_provider_kinetic import store

        row = store.put(KEY, state_dict(fill=True), conn_id="kinetic_gke")
        return {"version": row["version"], "sum": digest(state_dict(fill=True))}

    publish() >> KineticMapOperator(
        task_id="receive",
        python_callable=receive,
        inputs=[0, 1],
        max_concurrent=2,
        kinetic_conn_id="kinetic_gke",
        deferrable=False,
        poll_interval=0.2,
    )
