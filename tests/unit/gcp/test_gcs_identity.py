"""One Google identity: the GCS store's client carries the credentials of the
connection's gcp_conn_id (and impersonation), through providers-google's hook."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.gcp.gcs_auth import storage_client
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from tests.fixtures.local_conn import set_conn

EMAIL = "kinetic-jobs@proj.iam.gserviceaccount.com"


@pytest.fixture
def gcp_conn(monkeypatch) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    keyfile = {
        "type": "service_account", "project_id": "proj", "private_key_id": "k1",
        "private_key": pem, "client_email": EMAIL, "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }  # fmt: skip
    extra = {"keyfile_dict": json.dumps(keyfile), "project": "proj"}
    conn = {"conn_type": "google_cloud_platform", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_KN_GCP", json.dumps(conn))
    extras = {"backend": "gke", "bucket": "kn-jobs", "project": "proj", "zone": "z",
              "cluster": "c", "gcp_conn_id": "kn_gcp"}  # fmt: skip
    set_conn(monkeypatch, "kn_target", extras)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    return "kn_target"


def test_store_client_credentials_come_from_the_connection(gcp_conn):
    store = KineticHook(gcp_conn).get_store()
    creds = store.client._credentials
    assert creds.service_account_email == EMAIL
    assert store.bucket == "kn-jobs" and store.client.project == "proj"


def test_without_the_connection_the_store_keeps_default_credentials():
    config = KineticConfig(backend="gke", bucket="kn-jobs", gcp_conn_id="kn_missing")
    assert storage_client(config) is None
