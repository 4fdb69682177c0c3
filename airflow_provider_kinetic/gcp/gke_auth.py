"""Kubernetes API clients for a GKE cluster, authenticated with Google credentials.

The cluster's endpoint and CA come from the GKE API (providers-google's
``GKEHook.get_cluster``) once, as a :class:`ClusterEndpoint` of plain strings that
can travel in trigger kwargs; the triggerer then needs no second GKE API call and
no kubeconfig file.  The bearer token is a Google OAuth access token (about an
hour long), refreshed before every request that would otherwise carry a token
about to expire (google-auth treats a token as expired ~4 minutes early).

This is Airflow-layer code (credentials come from an Airflow GCP connection);
providers-google is imported inside :func:`gke_api_client_factory` only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import kubernetes.client as k8s


@dataclass(frozen=True)
class ClusterEndpoint:
    """Where the API server is and how to trust it; JSON-safe (see :meth:`to_dict`).

    ``ca_data`` is the base64 PEM bundle as GKE returns it
    (``master_auth.cluster_ca_certificate``); ``None`` for the DNS endpoint, whose
    certificate is publicly trusted.
    """

    host: str
    ca_data: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterEndpoint:
        return cls(host=data["host"], ca_data=data.get("ca_data"))


def endpoint_from_cluster(
    cluster: Any, *, use_internal_ip: bool = False, use_dns_endpoint: bool = False
) -> ClusterEndpoint:
    """A :class:`ClusterEndpoint` from a ``google.cloud.container_v1.Cluster``."""
    if use_dns_endpoint:
        dns = cluster.control_plane_endpoints_config.dns_endpoint_config.endpoint
        return ClusterEndpoint(host=f"https://{dns}")
    address = cluster.private_cluster_config.private_endpoint if use_internal_ip else None
    return ClusterEndpoint(
        host=f"https://{address or cluster.endpoint}",
        ca_data=cluster.master_auth.cluster_ca_certificate or None,
    )


def ca_file(ca_data: str) -> str:
    """A file holding the CA bundle (the clients take a path); one per bundle, reused.

    The name is the bundle's hash, so concurrent writers write identical bytes and
    the rename makes the file appear whole.
    """
    pem = base64.b64decode(ca_data)
    digest = hashlib.sha256(pem).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"kinetic-gke-ca-{digest}.crt")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        os.replace(tmp, path)
    return path


class GoogleTokenSource:
    """One google-auth credential's access token, refreshed when (nearly) expired.

    Thread-safe: worker threads share it.  ``invalidate`` forces the next read to
    refresh, for when the API server rejected a token that still looked valid.
    """

    def __init__(self, credentials: Any):
        self._credentials = credentials
        self._lock = threading.Lock()
        self._stale = False

    def needs_refresh(self) -> bool:
        creds = self._credentials
        return self._stale or creds.token is None or not creds.valid

    def token(self) -> str:
        with self._lock:
            if self.needs_refresh():
                from google.auth.transport.requests import Request

                self._credentials.refresh(Request())
                self._stale = False
            return str(self._credentials.token)

    async def atoken(self) -> str:
        """:meth:`token` without blocking the event loop when a refresh is due."""
        if self.needs_refresh():
            return await asyncio.to_thread(self.token)
        return str(self._credentials.token)

    def invalidate(self) -> None:
        self._stale = True


def _set_token(configuration: Any, token: str) -> None:
    # "BearerToken" is the key kubernetes>=36 and kubernetes_asyncio read;
    # "authorization" the one older kubernetes clients read.
    configuration.api_key = {"BearerToken": token, "authorization": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}


class GkeApiClientFactory:
    """Builds ``kubernetes`` (and ``kubernetes_asyncio``) clients for one GKE cluster.

    Calling it returns a sync ``ApiClient`` whose configuration refreshes the
    bearer token before requests (``refresh_api_key_hook``); :meth:`async_client`
    returns the asyncio equivalent, refreshing off the event loop.
    """

    def __init__(self, endpoint: ClusterEndpoint, tokens: GoogleTokenSource):
        self.endpoint = endpoint
        self.tokens = tokens

    def configuration(self) -> k8s.Configuration:
        cfg = k8s.Configuration(host=self.endpoint.host)
        if self.endpoint.ca_data:
            cfg.ssl_ca_cert = ca_file(self.endpoint.ca_data)
        _set_token(cfg, self.tokens.token())
        cfg.refresh_api_key_hook = lambda c: _set_token(c, self.tokens.token())
        return cfg

    def __call__(self) -> k8s.ApiClient:
        return k8s.ApiClient(self.configuration())

    async def async_client(self) -> Any:
        import kubernetes_asyncio.client as ak8s

        cfg = ak8s.Configuration(host=self.endpoint.host)
        if self.endpoint.ca_data:
            cfg.ssl_ca_cert = await asyncio.to_thread(ca_file, self.endpoint.ca_data)
        _set_token(cfg, await self.tokens.atoken())

        async def refresh(c: Any) -> None:
            _set_token(c, await self.tokens.atoken())

        cfg.refresh_api_key_hook = refresh
        return ak8s.ApiClient(cfg)

    def invalidate(self) -> None:
        self.tokens.invalidate()


def gke_api_client_factory(
    project: str,
    location: str,
    cluster: str,
    gcp_conn_id: str = "google_cloud_default",
    impersonation_chain: str | Sequence[str] | None = None,
    *,
    endpoint: ClusterEndpoint | dict[str, Any] | None = None,
    use_internal_ip: bool = False,
    use_dns_endpoint: bool = False,
) -> GkeApiClientFactory:
    """Client factory for GKE cluster ``cluster`` in ``project``/``location``.

    Credentials come from the Airflow connection ``gcp_conn_id`` (optionally
    impersonating ``impersonation_chain``).  Pass ``endpoint`` (e.g. the
    ``factory.endpoint.to_dict()`` a worker computed) to skip the GKE API call.
    """
    try:
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook
    except ImportError as exc:
        raise ImportError(
            f"GKE credentials need apache-airflow-providers-google ({exc}); "
            'install "airflow-provider-kinetic[gke]"'
        ) from exc

    hook = GKEHook(
        gcp_conn_id=gcp_conn_id, location=location, impersonation_chain=impersonation_chain
    )
    if isinstance(endpoint, dict):
        endpoint = ClusterEndpoint.from_dict(endpoint)
    if endpoint is None:
        found = hook.get_cluster(name=cluster, project_id=project)
        endpoint = endpoint_from_cluster(
            found, use_internal_ip=use_internal_ip, use_dns_endpoint=use_dns_endpoint
        )
    return GkeApiClientFactory(endpoint, GoogleTokenSource(hook.get_credentials()))
