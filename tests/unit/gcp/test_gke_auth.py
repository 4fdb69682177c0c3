"""GKE client factory: endpoint/CA handling and bearer-token refresh, without a cluster.

providers-google's ``GKEHook`` is replaced through ``sys.modules`` (the factory
imports it lazily), so these tests neither need nor import Airflow.
"""

from __future__ import annotations

import base64
import json
import sys
import types
from typing import Any

import pytest

from airflow_provider_kinetic.gcp.gke_auth import (
    ClusterEndpoint,
    GkeApiClientFactory,
    GoogleTokenSource,
    ca_file,
    endpoint_from_cluster,
    gke_api_client_factory,
)
from tests.fixtures.google_creds import FakeCredentials

PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
CA_DATA = base64.b64encode(PEM).decode()


def bearer(configuration: Any) -> str:
    return configuration.auth_settings()["BearerToken"]["value"]


def test_endpoint_is_json_safe() -> None:
    endpoint = ClusterEndpoint("https://10.0.0.1", CA_DATA)
    assert ClusterEndpoint.from_dict(json.loads(json.dumps(endpoint.to_dict()))) == endpoint


def test_endpoint_from_cluster_public_private_dns() -> None:
    cluster = types.SimpleNamespace(
        endpoint="34.1.2.3",
        master_auth=types.SimpleNamespace(cluster_ca_certificate=CA_DATA),
        private_cluster_config=types.SimpleNamespace(private_endpoint="10.0.0.2"),
        control_plane_endpoints_config=types.SimpleNamespace(
            dns_endpoint_config=types.SimpleNamespace(endpoint="gke-abc.us-central1.gke.goog")
        ),
    )
    assert endpoint_from_cluster(cluster) == ClusterEndpoint("https://34.1.2.3", CA_DATA)
    assert endpoint_from_cluster(cluster, use_internal_ip=True).host == "https://10.0.0.2"
    dns = endpoint_from_cluster(cluster, use_dns_endpoint=True)
    assert dns == ClusterEndpoint("https://gke-abc.us-central1.gke.goog", None)


def test_ca_file_holds_the_decoded_bundle() -> None:
    path = ca_file(CA_DATA)
    with open(path, "rb") as f:
        assert f.read() == PEM
    assert ca_file(CA_DATA) == path


def test_token_is_refreshed_before_expiry_and_on_invalidate() -> None:
    creds = FakeCredentials()
    factory = GkeApiClientFactory(
        ClusterEndpoint("https://34.1.2.3", CA_DATA), GoogleTokenSource(creds)
    )
    client = factory()
    cfg = client.configuration
    assert cfg.host == "https://34.1.2.3"
    with open(cfg.ssl_ca_cert, "rb") as f:
        assert f.read() == PEM
    assert bearer(cfg) == "Bearer tok-1"
    assert bearer(cfg) == "Bearer tok-1" and creds.refreshes == 1  # still valid: no refresh
    creds.expire_in(60)  # inside google-auth's refresh margin (~4 min): refreshed early
    assert bearer(cfg) == "Bearer tok-2"
    factory.invalidate()  # the API server said 401
    assert bearer(factory().configuration) == "Bearer tok-3"
    assert bearer(cfg) == "Bearer tok-3"  # older clients pick the new token up too


async def test_async_client_refreshes_off_the_loop() -> None:
    creds = FakeCredentials()
    factory = GkeApiClientFactory(ClusterEndpoint("https://34.1.2.3"), GoogleTokenSource(creds))
    client = await factory.async_client()
    try:
        cfg = client.configuration
        assert cfg.ssl_ca_cert is None  # DNS endpoint: public CA
        assert (await cfg.auth_settings())["BearerToken"]["value"] == "Bearer tok-1"
        creds.expire_in(0)
        assert (await cfg.auth_settings())["BearerToken"]["value"] == "Bearer tok-2"
    finally:
        await client.close()


class FakeGKEHook:
    instances: list[FakeGKEHook] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.clusters = kwargs, []
        FakeGKEHook.instances.append(self)

    def get_cluster(self, name: str, project_id: str) -> Any:
        self.clusters.append((name, project_id))
        return types.SimpleNamespace(
            endpoint="34.9.9.9", master_auth=types.SimpleNamespace(cluster_ca_certificate=CA_DATA)
        )

    def get_credentials(self) -> Any:
        return FakeCredentials()


@pytest.fixture
def fake_providers_google(monkeypatch: pytest.MonkeyPatch) -> type[FakeGKEHook]:
    module = types.ModuleType("airflow.providers.google.cloud.hooks.kubernetes_engine")
    module.GKEHook = FakeGKEHook  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    FakeGKEHook.instances = []
    return FakeGKEHook


def test_factory_looks_the_cluster_up_once(fake_providers_google: type[FakeGKEHook]) -> None:
    factory = gke_api_client_factory("proj", "us-central2-b", "c1", "gcp", ["sa@x.iam"])
    (hook,) = fake_providers_google.instances
    assert hook.kwargs == {
        "gcp_conn_id": "gcp",
        "location": "us-central2-b",
        "impersonation_chain": ["sa@x.iam"],
    }
    assert hook.clusters == [("c1", "proj")]
    assert factory.endpoint == ClusterEndpoint("https://34.9.9.9", CA_DATA)
    assert bearer(factory().configuration) == "Bearer tok-1"
    # A trigger passes the endpoint a worker computed: no second GKE API call.
    again = gke_api_client_factory(
        "proj", "us-central2-b", "c1", endpoint=factory.endpoint.to_dict()
    )
    assert fake_providers_google.instances[-1].clusters == []
    assert again.endpoint == factory.endpoint
