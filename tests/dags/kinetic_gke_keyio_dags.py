"""DAGs for tests/integration/operators/test_keyio_gke.py: ``output_key`` (deferrable) and
``Data("kinetic://KEY")`` on the GKE backend (the API double, the real runner,
fake-gcs-server).  The connection ``kinetic_gke`` is set by the test."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import Data, KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def gke_train() -> str:
    """Writes the model into the gs:// output dir, as a pod does."""
    import os

    from airflow_provider_kinetic.core.storage import store_for_uri

    store, prefix = store_for_uri(os.environ["KINETIC_OUTPUT_DIR"].rstrip("/"))
    store.write_bytes(f"{prefix}/model/weights.txt", b"gke weights")
    return "trained"


def gke_score(model: str) -> str:
    """Reads the model by key: a plain local directory in the pod."""
    import os

    with open(os.path.join(model, "model", "weights.txt")) as f:
        return f.read()


with DAG("kinetic_gke_keyio_train", schedule=None, start_date=START, catchup=False) as train:
    KineticRunOperator(
        task_id="train",
        python_callable=gke_train,
        output_key="gke-keyio/model",
        kinetic_conn_id="kinetic_gke",
        deferrable=True,
        poll_interval=0.1,
    )

with DAG("kinetic_gke_keyio_score", schedule=None, start_date=START, catchup=False) as score:
    KineticRunOperator(
        task_id="score",
        python_callable=gke_score,
        op_args=[Data("kinetic://gke-keyio/model")],
        kinetic_conn_id="kinetic_gke",
        deferrable=False,
        poll_interval=0.1,
    )
