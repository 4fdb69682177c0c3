"""One Kubernetes API request, and what its answer or failure means for a retry.

:mod:`~airflow_provider_kinetic.core.backends.k8s.retry` decides *when* to try again;
this module sends a single request and classifies the outcome, for both clients:

* :func:`call_sync` (``kubernetes``) and :func:`call_async` (``kubernetes_asyncio``)
  send one call raw (``_preload_content=False``) and return an :class:`Answer`:
  status, body and the ``Retry-After`` wait (:func:`retry_after_s`, delta-seconds or
  an HTTP date).  An HTTP error status is an answer, not an exception.
* urllib3 is told to leave retrying alone (:func:`call_sync` swaps the pool's retry
  settings for ones with no retries but redirects): left alone it would retry
  idempotent requests itself and sleep an uncapped ``Retry-After``, a second policy
  nobody configured.
* **429, 500, 502, 503, 504** (:data:`TRANSIENT_STATUSES`) are answers worth another
  attempt; :class:`Transient` carries one through tenacity.
* **Lost connections** (reset, refused, cut short, timed out) are the exceptions of
  :func:`sync_transport_errors` / :func:`async_transport_errors`; certificate and TLS
  set-up failures (:func:`is_tls_failure`) are not, since retrying does not heal them.
"""

from __future__ import annotations

import asyncio
import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import urllib3

#: Answers worth another attempt: throttled, or the server (or its proxy) failing.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


class ApiCall(Protocol):
    """What is sent (``gke.Call``): ``getattr(<api class>(client), method)(*args, **kwargs)``."""

    api: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """HTTP status, raw body and the ``Retry-After`` wait (seconds) of one request."""

    status: int
    body: bytes
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Transient(Exception):
    """An answer worth retrying, carried through tenacity."""

    def __init__(self, answer: Answer):
        super().__init__(f"HTTP {answer.status}")
        self.answer = answer


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _header(headers: Any, name: str) -> str | None:
    if not headers:
        return None
    getter = getattr(headers, "get", None)
    if getter is not None:  # urllib3's HTTPHeaderDict and aiohttp's CIMultiDict ignore case
        found = getter(name)
        if found is not None:
            return str(found)
    items = headers.items() if hasattr(headers, "items") else headers
    return next((str(v) for k, v in items if str(k).lower() == name.lower()), None)


# ---- what counts as a lost connection -------------------------------------------------------


def sync_transport_errors() -> tuple[type[BaseException], ...]:
    return (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


def async_transport_errors() -> tuple[type[BaseException], ...]:
    import aiohttp

    return (
        aiohttp.ClientConnectionError,
        aiohttp.ClientPayloadError,
        ConnectionError,
        asyncio.TimeoutError,
    )


def is_tls_failure(exc: BaseException) -> bool:
    """Certificate and TLS set-up failures do not heal by retrying."""
    import ssl

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError) or "SSL" in type(current).__name__:
            return True
        reason = getattr(current, "reason", None)  # urllib3's MaxRetryError wraps the cause
        current = (
            reason
            if isinstance(reason, BaseException)
            else current.__cause__ or current.__context__
        )
    return False


# ---- sync --------------------------------------------------------------------------------------


#: A call's ``api`` that sends through the client itself (``ApiClient.call_api``): a
#: path the typed client has no method for (Kueue's visibility API, ``k8s/queues.py``).
RAW_API = "ApiClient"


def call_sync(client: Any, call: ApiCall) -> Answer:
    """One request through the ``kubernetes`` client, raw (``_preload_content=False``)."""
    import kubernetes.client as k8s
    from kubernetes.client.exceptions import ApiException

    _own_the_retries(client)
    api = client if call.api == RAW_API else getattr(k8s, call.api)(client)
    try:
        resp = getattr(api, call.method)(*call.args, _preload_content=False, **call.kwargs)
    except ApiException as exc:
        if not exc.status:  # TLS or request-building failure, not an HTTP answer
            raise
        body = exc.body or b""
        body = body.encode() if isinstance(body, str) else body
        return Answer(exc.status, body, retry_after_s(_header(exc.headers, "Retry-After")))
    try:
        return Answer(
            resp.status, resp.data or b"", retry_after_s(_header(resp.headers, "Retry-After"))
        )
    finally:
        resp.release_conn()


def _own_the_retries(client: Any) -> None:
    """Make urllib3 leave retrying to :mod:`~airflow_provider_kinetic.core.backends.k8s.retry`.

    Left alone, the client's pool retries idempotent requests itself, three times at
    once, and sleeps whatever a 429/503 ``Retry-After`` asks, uncapped: a second
    policy nobody configured.  New pools pick this up (the retry setting is part of
    the pool key); redirects are still followed.
    """
    manager = getattr(getattr(client, "rest_client", None), "pool_manager", None)
    kw = getattr(manager, "connection_pool_kw", None)
    if kw is None or isinstance(kw.get("retries"), _NoRetry):
        return
    kw["retries"] = _NoRetry()


class _NoRetry(urllib3.Retry):
    """urllib3's retry settings for no retries but redirects; Retry-After is not slept."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("total", None)
        for name in ("connect", "read", "other", "status"):
            kwargs.setdefault(name, 0)
        kwargs.setdefault("redirect", 5)
        kwargs.setdefault("respect_retry_after_header", False)
        kwargs.setdefault("raise_on_status", False)
        super().__init__(**kwargs)


# ---- async -------------------------------------------------------------------------------------


async def call_async(client: Any, call: ApiCall) -> Answer:
    """One request through the ``kubernetes_asyncio`` client, raw."""
    import kubernetes_asyncio.client as ak8s

    api = client if call.api == RAW_API else getattr(ak8s, call.api)(client)
    resp = await getattr(api, call.method)(*call.args, _preload_content=False, **call.kwargs)
    try:
        return Answer(
            resp.status, await resp.read(), retry_after_s(_header(resp.headers, "Retry-After"))
        )
    finally:
        resp.release()
