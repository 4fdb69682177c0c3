"""DAGs for tests/integration/operators/test_keyio.py: keys as a Kinetic task's output
(``output_key``) and input (``Data("kinetic://KEY")``), on the local backend.

``KINETIC_KEYIO_TEST_DIR`` is the test's scratch dir (marker files of tries)."""

from __future__ import annotations

import datetime as dt
import os

import pendulum
from airflow.sdk import DAG, Asset, task

from airflow_provider_kinetic import Data, KineticMapOperator, KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
WORK = os.environ.get("KINETIC_KEYIO_TEST_DIR", "/tmp/kinetic-keyio-test")
KEY = "keyio/churn"


def train(text: str, fail: bool = False) -> dict:
    """Writes a model file into the output dir (fails after writing, on request)."""
    import os

    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.txt"), "w") as f:
        f.write(text)
    if fail:
        raise RuntimeError("training diverged")
    return {"wrote": text}


def score(model: str, work: str) -> dict:
    """Reads the model by key.  On the first try it moves the key on (from inside the
    job: no connection) and fails, so the retry shows which version a retry reads."""
    import os

    from airflow_provider_kinetic import store

    with open(os.path.join(model, "model.txt")) as f:
        text = f.read()
    marker = os.path.join(work, "score-tried")
    if not os.path.exists(marker):
        open(marker, "w").close()
        newer = os.path.join(work, "newer")
        os.makedirs(newer, exist_ok=True)
        with open(os.path.join(newer, "model.txt"), "w") as f:
            f.write("moved on")
        store.put("keyio/churn", newer)
        raise RuntimeError("first try fails after the key moved")
    return {"read": text}


with DAG(
    "kinetic_keyio_train",
    schedule=None,
    start_date=START,
    catchup=False,
    params={"model": "churn", "text": "v1"},
) as train_dag:
    KineticRunOperator(
        task_id="train",
        python_callable=train,
        op_kwargs={"text": "{{ params.text }}"},
        output_key="keyio/{{ params.model }}",
        poll_interval=0.2,
    )

with DAG("kinetic_keyio_train_fails", schedule=None, start_date=START, catchup=False) as fails:
    KineticRunOperator(
        task_id="train",
        python_callable=train,
        op_kwargs={"text": "half", "fail": True},
        output_key="keyio/never",
        poll_interval=0.2,
    )

with DAG("kinetic_keyio_score", schedule=None, start_date=START, catchup=False) as score_dag:
    KineticRunOperator(
        task_id="score",
        python_callable=score,
        op_kwargs={"model": Data(f"kinetic://{KEY}"), "work": WORK},
        retries=1,
        retry_delay=dt.timedelta(seconds=0),
        poll_interval=0.2,
    )

with DAG(
    "kinetic_keyio_on_key", schedule=[Asset(f"kinetic://{KEY}")], start_date=START, catchup=False
) as on_key:

    @task
    def react() -> str:
        return "a new churn model"

    react()

with DAG("kinetic_keyio_missing", schedule=None, start_date=START, catchup=False) as missing:
    KineticRunOperator(
        task_id="score",
        python_callable=score,
        op_kwargs={"model": Data("kinetic://keyio/chrun"), "work": WORK},
        poll_interval=0.2,
    )


def score_one(x: int, model: str) -> str:
    """One batch input scored with the model read by key."""
    import os

    with open(os.path.join(model, "model.txt")) as f:
        return f"{x}:{f.read()}"


with DAG("kinetic_keyio_map", schedule=None, start_date=START, catchup=False) as map_dag:
    KineticMapOperator(
        task_id="batch",
        python_callable=score_one,
        inputs=[1, 2],
        op_kwargs={"model": Data("kinetic://keyio/map-model")},
        poll_interval=0.2,
    )
