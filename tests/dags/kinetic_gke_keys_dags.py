"""DAG exercised by tests/integration/core/keys/test_keys_gke.py: keys inside a remote function
on the GKE backend (the API double, the real runner, fake-gcs-server), no connection
in the pod.  The connection ``kinetic_gke`` is set by the test."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def gke_keys() -> dict:
    """Gets the key the task put and puts a new one, from the 'pod'."""
    import os
    import shutil
    import sys
    import tempfile

    from airflow_provider_kinetic import store

    work = tempfile.mkdtemp()
    got = store.get("gke-keys/input", os.path.join(work, "in"))
    with open(os.path.join(work, "in")) as f:
        text = f.read()
    with open(os.path.join(work, "out.txt"), "w") as f:
        f.write(text[::-1])
    put = store.put("gke-keys/output", os.path.join(work, "out.txt"))
    shutil.rmtree(work)
    return {
        "got": got["version"],
        "put": put["version"],
        "by": put["by"],
        "airflow_imported": "airflow" in sys.modules,
    }


with DAG("kinetic_gke_keys", schedule=None, start_date=START, catchup=False) as gke_keys_dag:

    @task
    def publish() -> dict:
        import os
        import tempfile

        from airflow_provider_kinetic import store

        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "in.txt")
            with open(path, "w") as f:
                f.write("stressed")
            return store.put("gke-keys/input", path, conn_id="kinetic_gke")

    publish() >> KineticRunOperator(
        task_id="job",
        python_callable=gke_keys,
        kinetic_conn_id="kinetic_gke",
        deferrable=False,
        poll_interval=0.1,
    )
