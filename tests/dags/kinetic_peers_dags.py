"""DAGs exercised by tests/integration/core/keys/peer/test_peers_jobs.py: a batch's children share a
key and a ``Data`` by tree broadcast and hand each other ``locale="local"`` keys,
through the real runner (local backend, and the GKE API double's kubelet with
fake-gcs-server).  ``KINETIC_PEERS_TEST_DIR`` is set by the test, and for the GKE
DAG the connection ``kinetic_gke``; the local DAG uses the default connection."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
WORK = os.environ.get("KINETIC_PEERS_TEST_DIR", "/tmp/kinetic-peers-test")
CHILDREN = 3


def child(index: int, shared: str, prefix: str) -> dict:
    """Gets the key by broadcast, publishes a scratch key locally, reads its
    neighbour's, and stays up until every child has read (a barrier in the store)."""
    import os
    import tempfile
    import time

    from airflow_provider_kinetic import BroadcastWindow, store
    from airflow_provider_kinetic.core.data.value import content_hash_of
    from airflow_provider_kinetic.core.keys.names import KeyNotFound

    work = tempfile.mkdtemp()
    window = BroadcastWindow(fanout=1, timeout=60)
    got = store.get(f"{prefix}/model", os.path.join(work, "model"), broadcast=window)
    scratch = os.path.join(work, "scratch.txt")
    with open(scratch, "w") as f:
        f.write(f"from child {index}")
    put = store.put(f"{prefix}/scratch-{index}", scratch, locale="local")
    neighbour = (index + 1) % 3
    deadline = time.monotonic() + 90
    while True:  # the neighbour may not have published yet
        try:
            read = store.get(f"{prefix}/scratch-{neighbour}", os.path.join(work, "n.txt"))
            break
        except KeyNotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with open(os.path.join(work, "n.txt")) as f:
        text = f.read()
    done = os.path.join(work, "done")
    with open(done, "w") as f:
        f.write(str(index))
    store.put(f"{prefix}/read-{index}", done)
    while len(store.ls(f"{prefix}/read-")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    return {
        "key_version": got["version"],
        "key_sources": got["broadcast"]["sources"],
        "key_read": got["broadcast"]["read"],
        "data_hash": content_hash_of(shared, stat_cache=None),
        "local_put": put["locale"],
        "neighbour_text": text,
        "neighbour_source": read.get("source"),
    }


def _dag(dag_id: str, conn_id: str | None, prefix: str) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START, catchup=False) as dag:

        @task
        def publish() -> dict:
            from airflow_provider_kinetic import store

            src = os.path.join(WORK, "model")
            os.makedirs(src, exist_ok=True)
            for i in range(8):
                with open(os.path.join(src, f"w{i}.bin"), "wb") as f:
                    f.write(os.urandom(30_000))
            return store.put(f"{prefix}/model", src, conn_id=conn_id)

        publish() >> KineticMapOperator(
            task_id="children",
            python_callable=child,
            inputs=list(range(CHILDREN)),
            op_kwargs={"shared": Data(os.path.join(WORK, "shared")), "prefix": prefix},
            max_concurrent=CHILDREN,
            broadcast=True,
            **({} if conn_id is None else {"kinetic_conn_id": conn_id}),
            deferrable=False,
            poll_interval=0.2,
        )
    return dag


local_dag = _dag("kinetic_peers_local", None, "peers-local")
gke_dag = _dag("kinetic_peers_gke", "kinetic_gke", "peers-gke")
