"""Keys as a Kinetic task's output and input on the GKE backend: ``dag.test()``
against the Kubernetes API double, the real runner (played by the double's kubelet
thread) and fake-gcs-server.  A deferrable task's gs:// output dir becomes the key's
version (``output_key``); a later task reads it by key as a plain local directory in
the pod, from the data cache (nothing uploaded for it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.fake_gcs import requires_fake_gcs
from tests.fixtures.k8s_double import by_code_under_test
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures used by name
    JOBS,
    LOGICAL,
    Kubelet,
    connections,
    google_token,
    run_dag,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously

FILE = "kinetic_gke_keyio_dags.py"


class NthKubelet(Kubelet):
    """Plays the ``n``-th Job this test's API double receives (the double outlives one
    DAG run: each run's kubelet takes its own Job)."""

    def __init__(self, api: Any, n: int) -> None:  # noqa: F811
        super().__init__(api)
        self.n = n

    def play(self) -> None:
        def nth(d: Any) -> list[Any] | None:
            posts = by_code_under_test(d.sent("POST", JOBS))
            return posts if len(posts) > self.n else None

        posts = self.until(f"Job #{self.n}", nth)
        if posts:
            self.play_job(json.loads(posts[self.n].body))


def _run(load_dag: Any, dag_id: str, api: Any, n: int) -> Any:  # noqa: F811
    return run_dag(load_dag, dag_id, NthKubelet(api, n), FILE)


@requires_fake_gcs
def test_output_key_and_read_by_key_on_gke(load_dag, connections, api) -> None:  # noqa: F811
    keys = KeyStore(GcsStore(connections))
    trained = _run(load_dag, "kinetic_gke_keyio_train", api, 0)
    assert trained.state == "success", task_states(trained)
    row = {(t, k): v for (t, k, _), v in xcoms(trained).items()}[("train", "kinetic_output_key")]
    state = keys.state("gke-keyio/model")
    assert state is not None and state.current.version == row["version"] and row["new"] is True
    assert state.current.by["task_id"] == "train" and row["files"] == 1
    # The version's content is a data-cache entry in the bucket.
    names = keys.store.list(cache_key(row["version"]) + "/")
    assert [n.rsplit("/", 2)[-2:] for n in names] == [["model", "weights.txt"]]

    scored = _run(load_dag, "kinetic_gke_keyio_score", api, 1)
    assert scored.state == "success", task_states(scored)
    x = {(t, k): v for (t, k, _), v in xcoms(scored).items()}
    assert x[("score", "return_value")] == "gke weights"
    assert x[("score", "kinetic_keys")] == [
        {"key": "gke-keyio/model", "version": row["version"], "source": "resolved"}
    ]
