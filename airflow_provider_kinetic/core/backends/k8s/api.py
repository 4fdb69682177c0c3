"""Kubernetes API calls as data, and the two drivers that send them.

A backend operation is written once, as a *plan*: a generator that yields API calls
(:class:`Call`) and receives their replies (:class:`Reply`), holding no client.
:class:`PlanDriver` runs plans with the blocking ``kubernetes`` client (worker
processes) or with ``kubernetes_asyncio`` (the triggerer's event loop), so the sync
and async paths cannot drift apart.  Replies are raw JSON (``_preload_content=False``):
no model round trip that could choke on fields newer than the client, and pod logs
arrive byte for byte (the typed client mangles JSON-looking log lines).

Every call goes through :mod:`~airflow_provider_kinetic.core.backends.k8s.retry`:
transient failures retried, and a 401 (GKE tokens last an hour) rebuilds the client
from the factory once (a GKE factory refreshes its token) and repeats the call.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kubernetes.client as k8s

from airflow_provider_kinetic.core.backends.k8s import retry as k8s_retry
from airflow_provider_kinetic.core.errors import KineticError

T = TypeVar("T")
ApiClientFactory = Callable[[], k8s.ApiClient]
#: Returns a ``kubernetes_asyncio`` ApiClient (or an awaitable of one).
AsyncApiClientFactory = Callable[[], Any]


@dataclass(frozen=True)
class Call:
    """One API call: ``getattr(<api class>(client), method)(*args, **kwargs)``."""

    api: str
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """HTTP status and raw body of one call."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


Plan = Generator[Call, Reply, T]


class KubernetesApiError(KineticError, RuntimeError):
    """A call the API server refused; ``status`` is the HTTP code, the message is the server's."""

    def __init__(self, what: str, reply: Reply):
        self.status = reply.status
        try:
            detail = (reply.json() or {}).get("message") or ""
        except (ValueError, AttributeError):
            detail = reply.body[:300].decode("utf-8", "replace")
        super().__init__(f"{what}: HTTP {reply.status} {detail}".rstrip())


def json_or_none(reply: Reply, what: str) -> dict[str, Any] | None:
    """The object in ``reply``, ``None`` on 404, raise on any other error."""
    if reply.status == 404:
        return None
    if not reply.ok:
        raise KubernetesApiError(what, reply)
    return reply.json()


def items(reply: Reply, what: str) -> list[dict[str, Any]]:
    """The ``items`` of a list reply; raise on any error."""
    if not reply.ok:
        raise KubernetesApiError(what, reply)
    return list((reply.json() or {}).get("items") or [])


class PlanDriver:
    """Runs plans against one API server: a shared sync client (built lazily from
    ``api_client_factory``) and a fresh async client per async plan."""

    def __init__(
        self,
        api_client_factory: ApiClientFactory,
        async_api_client_factory: AsyncApiClientFactory | None = None,
    ):
        self._factory = api_client_factory
        self._async_factory = async_api_client_factory or getattr(
            api_client_factory, "async_client", None
        )
        self._client: k8s.ApiClient | None = None
        self._lock = threading.Lock()

    def _run(self, plan: Plan[T]) -> T:
        """Send the plan's calls in turn; a call that fails without an answer (its
        connection lost on every attempt) raises inside the plan, at its ``yield``, so a
        plan can tell what that call may have done (a create may have happened)."""
        try:
            call = next(plan)
            while True:
                try:
                    reply = self._send(call)
                except Exception as exc:  # noqa: BLE001 - handed to the plan, re-raised there
                    call = plan.throw(exc)
                    continue
                call = plan.send(reply)
        except StopIteration as stop:
            return stop.value

    def _send(self, call: Call) -> Reply:
        """One call: 429/5xx/lost connections retried, a 401 renews the client once
        (:mod:`~airflow_provider_kinetic.core.backends.k8s.retry`)."""
        policy = k8s_retry.policy_for(self)
        answer = k8s_retry.send(call, self._sync_client, self._reset_client, policy)
        return Reply(answer.status, answer.body)

    def _sync_client(self) -> k8s.ApiClient:
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def _reset_client(self, stale: k8s.ApiClient) -> None:
        # Not closed: another thread may still be using it; it goes with its last user.
        with self._lock:
            if self._client is stale:
                self._client = None
                _invalidate(self._factory)

    async def _arun(self, plan: Plan[T], shared: list[Any] | None = None) -> T:
        """Run ``plan`` on a fresh async client, closed after; or on ``shared[0]``, a
        client its owner keeps open for many plans at once (a shared reader's: making
        one costs an SSL context, tens of ms of the loop).  A renewed shared client
        replaces ``shared[0]``; the stale one is left open for the plans still on it,
        and every client made is appended to ``shared`` for its owner to close."""
        if shared is not None and shared[0] is None:
            shared[0] = await self._new_async_client()
            shared.append(shared[0])
        client = shared[0] if shared is not None else await self._new_async_client()
        try:
            call = next(plan)
            while True:
                try:
                    reply, client = await self._asend(call, client, shared)
                except Exception as exc:  # noqa: BLE001 - handed to the plan (see _run)
                    call = plan.throw(exc)
                    continue
                call = plan.send(reply)
        except StopIteration as stop:
            return stop.value
        finally:
            if shared is None:
                await client.close()

    async def _asend(
        self, call: Call, client: Any, shared: list[Any] | None = None
    ) -> tuple[Reply, Any]:
        """:meth:`_send` on the event loop; returns the client to go on with."""

        async def renew(stale: Any) -> Any:
            if shared is None:
                await stale.close()
            _invalidate(self._factory)
            if self._async_factory is not None:
                _invalidate(self._async_factory)
            with self._lock:
                self._client = None
            fresh = await self._new_async_client()
            if shared is not None:
                shared[0] = fresh
                shared.append(fresh)
            return fresh

        policy = k8s_retry.policy_for(self)
        answer, client = await k8s_retry.asend(call, client, renew, policy)
        return Reply(answer.status, answer.body), client

    async def _new_async_client(self) -> Any:
        if self._async_factory is not None:
            made = self._async_factory()
            return await made if inspect.isawaitable(made) else made
        import kubernetes_asyncio.client as ak8s

        # Building the sync client may fetch a token: off the loop.  The aiohttp
        # session inside the async client must be made on the loop.
        sync_client = await asyncio.to_thread(self._sync_client)
        cfg = await asyncio.to_thread(async_configuration_like, sync_client)
        return ak8s.ApiClient(cfg)


def async_configuration_like(client: k8s.ApiClient) -> Any:
    """A ``kubernetes_asyncio`` Configuration with the same host, TLS settings and token.

    The token is copied as it is now (a sync refresh hook may block, which an
    event loop must not do); a 401 makes the driver build a fresh copy.
    """
    import kubernetes_asyncio.client as ak8s

    src = client.configuration
    cfg = ak8s.Configuration(host=src.host)
    for attr in ("ssl_ca_cert", "verify_ssl", "cert_file", "key_file", "tls_server_name", "proxy"):
        if hasattr(src, attr) and hasattr(cfg, attr):
            setattr(cfg, attr, getattr(src, attr))
    token = src.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token:
        cfg.api_key = {"BearerToken": token}
    return cfg


def _invalidate(factory: Any) -> None:
    invalidate = getattr(factory, "invalidate", None)
    if callable(invalidate):
        invalidate()
