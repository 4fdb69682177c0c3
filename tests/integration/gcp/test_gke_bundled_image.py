"""``dag.test()`` on the GKE backend with a bundled image: the task finds its image tag
in Artifact Registry or builds it with Cloud Build, then runs the Job in it.

The Kubernetes side is test_gke_dags.py's (API double + test kubelet running the real
runner); Artifact Registry and Cloud Build are the loopback double, reached by the real
clients through ``KINETIC_IMAGE_API_ENDPOINT``; the build context travels through
fake-gcs-server, where the double reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.runtime.images import plan_image
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from airflow_provider_kinetic.gcp.image_build import BUILDS_PREFIX, ENDPOINT_ENV
from tests.dags.kinetic_image_dags import REQUIREMENTS
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.cloudbuild_double import CloudBuildDouble, cloudbuild_double
from tests.fixtures.local_conn import set_conn
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures used by name
    JOBS,
    LOGICAL,
    NS,
    Kubelet,
    google_token,
    run_dag,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously

CONN = {"backend": "gke", "project": "proj", "zone": "us-central1-a", "cluster": "c1",
        "namespace": NS}  # fmt: skip


@pytest.fixture
def bundled(monkeypatch, api, gcs_bucket: str, google_token) -> Iterator[CloudBuildDouble]:  # noqa: F811
    extras = {**CONN, "bucket": gcs_bucket, "endpoint": {"host": api.host, "ca_data": None}}
    set_conn(monkeypatch, "kinetic_gke_bundled", extras)
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    with cloudbuild_double(lambda b, k: GcsStore(b).read_bytes(k)) as double:
        monkeypatch.setenv(ENDPOINT_ENV, double.endpoint)
        yield double


def expected_uri(bucket: str) -> str:
    config = KineticConfig(**CONN, bucket=bucket, endpoint={"host": "https://x"})
    return plan_image(container_image=None, requirements=REQUIREMENTS, entry_file=None,
                      category="cpu", local=False, config=config).uri  # fmt: skip


@pytest.mark.parametrize("cached", [True, False], ids=["tag-exists", "tag-missing"])
def test_bundled_image_found_or_built_then_run(load_dag, api, bundled, gcs_bucket, cached):  # noqa: F811
    uri = expected_uri(gcs_bucket)
    assert uri.startswith("us-central1-docker.pkg.dev/proj/kn-c1/base:cpu-")
    if cached:
        bundled.add_tag(uri)
    kubelet = Kubelet(api)
    dr = run_dag(load_dag, "kinetic_gke_bundled", kubelet, "kinetic_image_dags.py")
    assert dr.state == "success", task_states(dr)
    container = kubelet.job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == uri  # the tag is the hash of the image's inputs
    assert "--requirements-gcs" not in container["args"]  # baked into the image
    handle = {k: v for (t, k, _), v in xcoms(dr).items() if k == "kinetic_job"}["kinetic_job"]
    assert handle["image_uri"] == uri
    if cached:
        assert bundled.builds == []
    elif not cached:
        [build] = bundled.builds
        assert list(build.images) == [uri] and uri in build.steps[0].args
        files = bundled.sources[build.id]
        assert files["requirements.txt"] == b"six>=1.16\n"
        assert GcsStore(gcs_bucket).list(BUILDS_PREFIX + "/") == []
    # Looked up once; the Job was created after the image was known to exist.
    tag_reads = [p for m, p in bundled.requests if m == "GET" and "/tags/" in p]
    assert len(tag_reads) == 1
    assert len(api.sent("POST", JOBS)) == 1
