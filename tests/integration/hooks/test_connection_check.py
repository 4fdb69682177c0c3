"""``KineticHook.test_connection()`` against real parts: fake-gcs-server for the store, the
loopback Kubernetes API double for the cluster, real Airflow connections from env vars.

Only Google's OAuth token is faked (it cannot exist offline): ``google.auth.default``
hands out :class:`FakeCredentials`, so providers-google still reads the
``google_cloud_default`` connection and builds the cluster's client factory.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_kinetic.hooks.kinetic import KineticHook
from tests.fixtures.google_creds import FakeCredentials
from tests.fixtures.k8s_double import ThreadedDouble
from tests.fixtures.local_conn import set_conn

NS = "ml-jobs"
LWS_RESOURCE = "leaderworkerset.x-k8s.io/v1/leaderworkersets"

pytestmark = pytest.mark.k8s_api(threaded=True, namespaces=(NS,))  # the hook calls it synchronously


@pytest.fixture
def google_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("google.auth.default", lambda scopes=None, **_: (FakeCredentials(), "proj"))
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))


def connect(monkeypatch: pytest.MonkeyPatch, **extras: Any) -> KineticHook:
    return KineticHook(set_conn(monkeypatch, "kinetic_check", extras))


def cluster(api: ThreadedDouble, bucket: str, **more: Any) -> dict[str, Any]:
    return {
        "backend": "gke",
        "bucket": bucket,
        "project": "proj",
        "zone": "us-central1-a",
        "cluster": "c1",
        "namespace": NS,
        "endpoint": {"host": api.host, "ca_data": None},
        **more,
    }


def objects(fake_gcs: Any, bucket: str) -> list[str]:
    return [b.name for b in fake_gcs.client().list_blobs(bucket)]


def test_local_store_probe(monkeypatch, tmp_path):
    hook = connect(monkeypatch, root=str(tmp_path / "store"))
    ok, message = hook.test_connection()
    assert ok, message
    assert (
        message
        == f"store file://{tmp_path}/store works (probe object written, read back and deleted)"
    )
    assert list((tmp_path / "store").iterdir()) == []  # nothing left behind


@pytest.mark.usefixtures("google_token")
def test_gke_store_cluster_and_namespace(monkeypatch, api, fake_gcs, gcs_bucket):
    ok, message = connect(monkeypatch, **cluster(api, gcs_bucket)).test_connection()
    assert ok, message
    assert f"store gs://{gcs_bucket} works" in message
    assert f"cluster c1 ({api.host}) answers, v1." in message
    assert f"namespace '{NS}' exists" in message and "LeaderWorkerSet" not in message
    assert objects(fake_gcs, gcs_bucket) == []  # the probe was deleted
    assert [r.url.path for r in api.sent("GET")] == ["/version/", f"/api/v1/namespaces/{NS}"]
    assert all(r.headers["Authorization"] == "Bearer tok-1" for r in api.sent("GET"))


@pytest.mark.usefixtures("google_token")
def test_missing_namespace_fails_and_says_so(monkeypatch, api, fake_gcs, gcs_bucket):
    hook = connect(monkeypatch, **cluster(api, gcs_bucket, namespace="nope"))
    ok, message = hook.test_connection()
    assert not ok
    assert f"store gs://{gcs_bucket} works" in message  # what was checked before the failure
    assert "namespace 'nope' does not exist in cluster c1" in message
    assert objects(fake_gcs, gcs_bucket) == []


@pytest.mark.usefixtures("google_token")
def test_pathways_needs_the_leaderworkerset_api(monkeypatch, api, fake_gcs, gcs_bucket):
    hook = connect(monkeypatch, **cluster(api, gcs_bucket, backend="pathways"))
    ok, message = hook.test_connection()
    assert ok and "the LeaderWorkerSet API (leaderworkerset.x-k8s.io) is installed" in message

    def uninstall(d: Any) -> None:
        del d.resources[LWS_RESOURCE]

    api.call(uninstall)
    ok, message = hook.test_connection()
    assert not ok
    assert "the LeaderWorkerSet API (leaderworkerset.x-k8s.io) is not installed in cluster c1" in (
        message
    )
    assert objects(fake_gcs, gcs_bucket) == []


@pytest.mark.usefixtures("google_token")
def test_auto_without_leaderworkerset_passes_with_a_note(monkeypatch, api, fake_gcs, gcs_bucket):
    api.call(lambda d: d.resources.pop(LWS_RESOURCE))
    ok, message = connect(monkeypatch, **cluster(api, gcs_bucket, backend="auto")).test_connection()
    assert ok, message
    assert "LeaderWorkerSet API (leaderworkerset.x-k8s.io) is not installed: multi-host" in message


@pytest.mark.usefixtures("google_token")
def test_the_jobset_backend_needs_the_jobset_api(monkeypatch, api, fake_gcs, gcs_bucket):
    hook = connect(monkeypatch, **cluster(api, gcs_bucket, backend="jobset"))
    ok, message = hook.test_connection()
    assert ok and "the JobSet API (jobset.x-k8s.io) is installed" in message
    assert "LeaderWorkerSet" not in message
    api.call(lambda d: d.resources.pop("jobset.x-k8s.io/v1alpha2/jobsets"))
    ok, message = hook.test_connection()
    assert not ok
    assert "the JobSet API (jobset.x-k8s.io) is not installed in cluster c1: the jobset" in message
    auto = connect(monkeypatch, **cluster(api, gcs_bucket, backend="auto"))
    ok, message = auto.test_connection()
    assert ok and "JobSet API (jobset.x-k8s.io) is not installed: multi-slice jobs" in message


@pytest.mark.usefixtures("google_token")
def test_a_cluster_that_does_not_answer(monkeypatch, fake_gcs, gcs_bucket):
    extras = {
        "backend": "gke",
        "bucket": gcs_bucket,
        "project": "proj",
        "zone": "z",
        "cluster": "c1",
        "endpoint": {"host": "http://127.0.0.1:9", "ca_data": None},  # nothing listens
    }
    ok, message = connect(monkeypatch, **extras).test_connection()
    assert not ok and f"store gs://{gcs_bucket} works" in message
    assert "reading the cluster version: the API server http://127.0.0.1:9 did not answer" in (
        message
    )


def test_a_bucket_that_does_not_exist(monkeypatch, fake_gcs):
    ok, message = connect(monkeypatch, backend="gke", bucket="no-such-bucket-here",
                          project="p", zone="z", cluster="c").test_connection()  # fmt: skip
    assert not ok
    assert "store gs://no-such-bucket-here: writing a probe object failed: NotFound" in message
    assert "cluster" not in message  # the store failed first: no cluster call was made


def test_a_bad_configuration_is_reported(monkeypatch):
    ok, message = connect(monkeypatch, backend="gke", bucket="Bad_Bucket").test_connection()
    assert not ok
    assert message.startswith("KineticConfigError: invalid GCS bucket name 'Bad_Bucket'")
