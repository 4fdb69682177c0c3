"""Keys inside a remote function on the GKE backend: a ``dag.test()`` run against the
Kubernetes API double, the real runner (played by the double's kubelet thread) and
fake-gcs-server.  The task puts with ``conn_id=``; the pod gets and puts with no
connection, on the job's own bucket."""

from __future__ import annotations

import pytest

from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.fake_gcs import requires_fake_gcs
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures used by name
    Kubelet,
    connections,
    google_token,
    run_dag,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously


@requires_fake_gcs
def test_keys_inside_a_gke_job(load_dag, connections, api) -> None:  # noqa: F811
    bucket = connections
    dr = run_dag(load_dag, "kinetic_gke_keys", Kubelet(api), "kinetic_gke_keys_dags.py")
    assert dr.state == "success", task_states(dr)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    published, in_job = x[("publish", "return_value")], x[("job", "return_value")]
    assert in_job["got"] == published["version"] and in_job["airflow_imported"] is False
    job_id = x[("job", "kinetic_job")]["job_id"]
    assert in_job["by"]["job_id"] == job_id and in_job["by"]["task_id"] == "job"
    keys = KeyStore(GcsStore(bucket))
    assert {r["key"]: r["version"] for r in keys.ls("gke-keys/")} == {
        "gke-keys/input": published["version"],
        "gke-keys/output": in_job["put"],
    }
