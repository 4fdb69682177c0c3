"""The tensor broadcast through the GKE backend: ``dag.test()`` against the Kubernetes
API double, fake-gcs-server as the store (the rendezvous by generation match), and a
kubelet that runs every child Job's real runner at the same time (a quorum needs its
peers alive together, so the one-after-the-other batch kubelet cannot play it)."""

from __future__ import annotations

import pytest

from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.fake_gcs import requires_fake_gcs
from tests.integration.core.backends.k8s import test_gke_dags as gke
from tests.integration.core.backends.k8s.test_gke_dags import run_dag

# The kubelet that runs every child's runner at once (the peers' test plays it too).
from tests.integration.core.keys.peer.test_peers_jobs import ConcurrentKubelet

pytest.importorskip("torch")
pytest.importorskip("safetensors")

# The GKE DAG tests' fixtures: the API double, the faked Google token, the connections.
google_token, connections = gke.google_token, gke.connections
pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously


@requires_fake_gcs
def test_tensor_broadcast_between_gke_children(load_dag, connections, api) -> None:
    kubelet = ConcurrentKubelet(api, 2)
    dr = run_dag(load_dag, "kinetic_gke_tensors", kubelet, "kinetic_gke_tensor_dags.py")
    assert dr.state == "success", (task_states(dr), kubelet.logs)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    published, got = x[("publish", "return_value")], x[("receive", "return_value")]
    assert sorted(r["rank"] for r in got) == [0, 1]
    assert {r["sum"] for r in got} == {published["sum"]}
    # Only rank 0 read the key's blob from the bucket; the other got it from rank 0.
    assert sorted((r["source"], len(r["reads"])) for r in got) == [("peer", 0), ("store", 1)]
