"""Sending one Kubernetes API call: transient failures retried, a stale token renewed.

The GKE backend's drivers (``GkeBackend._send`` / ``_asend``) hand every call here,
so creates, status reads, log reads and deletes, sync and async, share one policy:

* **429, 500, 502, 503, 504 and lost connections** (reset, refused, cut short) are
  retried with exponential backoff and jitter (tenacity, as providers-cncf-kubernetes
  does); a ``Retry-After`` header is honoured (capped).  When the budget is spent the
  last answer is returned (the caller's error then names the status, and the message
  says how many attempts were made) or the last connection error is raised.
* **401** means the bearer token went stale (GKE tokens last an hour): the client is
  rebuilt once (``renew``) and the call repeated at once; a second 401 is the answer.
* **A create is not repeated into a duplicate.**  A create whose answer was lost
  (5xx, dropped connection) may have happened; when its retry answers 409
  AlreadyExists, the object is read back and, if it carries the labels that were
  sent, it is taken as created (its body is the answer, as a 201 would have been).

The policy (:class:`RetryPolicy`) is small by default and per backend
(``backend.retry_policy``); the Airflow layer sets it from ``[kinetic]`` options and
tests pass a recording ``sleep`` so nothing waits for real.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import tenacity
import urllib3

log = logging.getLogger(__name__)

#: Answers worth another attempt: throttled, or the server (or its proxy) failing.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


class ApiCall(Protocol):
    """What is sent (``gke.Call``): ``getattr(<api class>(client), method)(*args, **kwargs)``."""

    api: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures of one API call are retried.

    ``attempts`` counts every try (1 = no retry).  Waits grow from
    ``wait_initial_s`` (doubling, plus up to ``wait_initial_s`` of jitter) to at most
    ``wait_max_s``; a ``Retry-After`` answer waits what it asks, up to
    ``retry_after_max_s``.  ``sleep`` / ``asleep`` replace ``time.sleep`` /
    ``asyncio.sleep`` (tests record the waits instead of waiting).
    """

    attempts: int = 5
    wait_initial_s: float = 0.5
    wait_max_s: float = 15.0
    retry_after_max_s: float = 30.0
    sleep: Callable[[float], None] | None = None
    asleep: Callable[[float], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Kubernetes API attempts must be at least 1, got {self.attempts}")
        for name in ("wait_initial_s", "wait_max_s", "retry_after_max_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")


DEFAULT_POLICY = RetryPolicy()


def policy_for(backend: Any) -> RetryPolicy:
    """The backend's ``retry_policy`` (set by the Airflow layer or a test), else the default."""
    return getattr(backend, "retry_policy", None) or DEFAULT_POLICY


@dataclass(frozen=True)
class Answer:
    """HTTP status, raw body and the ``Retry-After`` wait (seconds) of one request."""

    status: int
    body: bytes
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class _Transient(Exception):
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


def _sync_transport_errors() -> tuple[type[BaseException], ...]:
    return (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


def _async_transport_errors() -> tuple[type[BaseException], ...]:
    import aiohttp

    return (
        aiohttp.ClientConnectionError,
        aiohttp.ClientPayloadError,
        ConnectionError,
        asyncio.TimeoutError,
    )


def _is_tls_failure(exc: BaseException) -> bool:
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


# ---- one call, whichever client --------------------------------------------------------------


class _CallState:
    """What one logical call has seen across its attempts."""

    def __init__(self, call: ApiCall, transport_errors: tuple[type[BaseException], ...]):
        self.call = call
        self.transport_errors = transport_errors
        self.creating = call.method.startswith("create_")
        #: an earlier attempt of this create may have taken effect (5xx, lost answer)
        self.maybe_created = False
        self.renewed = False

    def lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a lost connection worth retrying (and note it)."""
        if not isinstance(exc, self.transport_errors) or _is_tls_failure(exc):
            return False
        self.maybe_created = self.maybe_created or self.creating
        return True

    def wants_readback(self, answer: Answer) -> bool:
        return self.creating and self.maybe_created and answer.status == 409

    def readback(self) -> _Read | None:
        """The read of the object this create names (``None`` when it cannot be told)."""
        return _readback(self.call)

    def adopt(self, conflict: Answer, read: Answer, read_call: _Read) -> Answer:
        """A 409 after a lost create: the object is ours if it carries the labels we sent
        (admission may add labels of its own)."""
        if read.status in TRANSIENT_STATUSES:
            return read  # judged transient: the whole create is tried again
        if not read.ok:
            return conflict
        try:
            found = json.loads(read.body)
        except ValueError:
            return conflict
        have = _labels(found)
        if any(have.get(key) != value for key, value in _labels(read_call.body).items()):
            return conflict  # someone else's object of the same name
        log.info(
            "%s: the object exists after an earlier attempt lost its answer; taking it as created",
            read_call.describe,
        )
        return Answer(201, read.body)

    def judge(self, answer: Answer) -> Answer:
        """Raise for an answer worth retrying; return any other."""
        if answer.status in TRANSIENT_STATUSES:
            if self.creating and answer.status != 429:  # 429: throttled before it happened
                self.maybe_created = True
            raise _Transient(answer)
        return answer


@dataclass(frozen=True)
class _Read:
    """A read-back call derived from a create (duck-types ``gke.Call``)."""

    api: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    body: dict[str, Any]

    @property
    def describe(self) -> str:
        meta = self.body.get("metadata") or {}
        return f"creating {self.body.get('kind', 'object')} {meta.get('name')}"


def _labels(obj: Any) -> dict[str, Any]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _readback(call: ApiCall) -> _Read | None:
    """The read of what a create names.

    ``create_namespaced_X(ns, body)`` -> ``read_namespaced_X(name, ns)``;
    ``create_namespaced_custom_object(g, v, ns, plural, body)`` ->
    ``get_namespaced_custom_object(g, v, ns, plural, name)``.
    """
    if not call.args or not isinstance(call.args[-1], dict):
        return None
    body = call.args[-1]
    name = (body.get("metadata") or {}).get("name")
    if not name:
        return None
    if call.method == "create_namespaced_custom_object" and len(call.args) == 5:
        group, version, ns, plural, _ = call.args
        args: tuple[Any, ...] = (group, version, ns, plural, name)
        return _Read(call.api, "get_namespaced_custom_object", args, {}, body)
    if call.method.startswith("create_namespaced_") and len(call.args) == 2:
        method = "read_namespaced_" + call.method.removeprefix("create_namespaced_")
        return _Read(call.api, method, (name, call.args[0]), {}, body)
    return None


def _wait(policy: RetryPolicy) -> Callable[[tenacity.RetryCallState], float]:
    backoff = tenacity.wait_exponential_jitter(
        initial=policy.wait_initial_s, max=policy.wait_max_s, jitter=policy.wait_initial_s
    )

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Transient) and exc.answer.retry_after is not None:
            return min(exc.answer.retry_after, policy.retry_after_max_s)
        return min(backoff(state), policy.wait_max_s)

    return wait


def _describe(call: ApiCall) -> str:
    return f"{call.api}.{call.method}"


def _tenacity_kwargs(policy: RetryPolicy, state: _CallState) -> dict[str, Any]:
    def should_retry(exc: BaseException) -> bool:
        return isinstance(exc, _Transient) or state.lost(exc)

    def before_sleep(retry: tenacity.RetryCallState) -> None:
        exc = retry.outcome.exception() if retry.outcome else None
        what = f"HTTP {exc.answer.status}" if isinstance(exc, _Transient) else repr(exc)
        wait = retry.next_action.sleep if retry.next_action else 0.0
        log.warning(
            "Kubernetes API %s: %s; attempt %d of %d, retrying in %.2f s",
            _describe(state.call), what, retry.attempt_number, policy.attempts, wait,
        )  # fmt: skip

    def give_up(retry: tenacity.RetryCallState) -> Answer:
        exc = retry.outcome.exception() if retry.outcome else None
        if isinstance(exc, _Transient):
            note = f"gave up after {retry.attempt_number} attempts"
            log.warning("Kubernetes API %s: HTTP %d, %s", _describe(state.call),
                        exc.answer.status, note)  # fmt: skip
            return Answer(exc.answer.status, _annotate(exc.answer.body, note))
        assert exc is not None
        raise exc

    return {
        "stop": tenacity.stop_after_attempt(policy.attempts),
        "wait": _wait(policy),
        "retry": tenacity.retry_if_exception(should_retry),
        "before_sleep": before_sleep,
        "retry_error_callback": give_up,
    }


def _annotate(body: bytes, note: str) -> bytes:
    """Add ``note`` to the message of a Kubernetes ``Status`` body (or to plain text)."""
    try:
        status = json.loads(body) if body else None
    except ValueError:
        status = None
    if isinstance(status, dict):
        message = status.get("message") or ""
        status["message"] = f"{message} ({note})" if message else note
        return json.dumps(status).encode()
    text = body[:300].decode("utf-8", "replace").strip()
    return json.dumps({"message": f"{text} ({note})" if text else note}).encode()


# ---- sync --------------------------------------------------------------------------------------


def call_sync(client: Any, call: ApiCall) -> Answer:
    """One request through the ``kubernetes`` client, raw (``_preload_content=False``)."""
    import kubernetes.client as k8s
    from kubernetes.client.exceptions import ApiException

    _own_the_retries(client)
    api = getattr(k8s, call.api)(client)
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
    """Make urllib3 leave retrying to this module.

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


def send(
    call: ApiCall,
    client: Callable[[], Any],
    renew: Callable[[Any], None],
    policy: RetryPolicy = DEFAULT_POLICY,
) -> Answer:
    """Send ``call`` with the client ``client()`` returns, retrying as the module says.

    ``renew(stale)`` drops a client whose token the server refused, so that the next
    ``client()`` builds a fresh one.
    """
    state = _CallState(call, _sync_transport_errors())

    def once(what: ApiCall) -> Answer:
        current = client()
        answer = call_sync(current, what)
        if answer.status == 401 and not state.renewed:
            state.renewed = True
            log.info("Kubernetes API answered 401; refreshing credentials and retrying once")
            renew(current)
            answer = call_sync(client(), what)
        return answer

    def attempt() -> Answer:
        answer = once(call)
        if state.wants_readback(answer) and (read := state.readback()) is not None:
            answer = state.adopt(answer, once(read), read)
        return state.judge(answer)

    kwargs = _tenacity_kwargs(policy, state)
    kwargs["sleep"] = policy.sleep if policy.sleep is not None else time.sleep
    return tenacity.Retrying(**kwargs)(attempt)


# ---- async -------------------------------------------------------------------------------------


async def call_async(client: Any, call: ApiCall) -> Answer:
    """One request through the ``kubernetes_asyncio`` client, raw."""
    import kubernetes_asyncio.client as ak8s

    api = getattr(ak8s, call.api)(client)
    resp = await getattr(api, call.method)(*call.args, _preload_content=False, **call.kwargs)
    try:
        return Answer(
            resp.status, await resp.read(), retry_after_s(_header(resp.headers, "Retry-After"))
        )
    finally:
        resp.release()


async def asend(
    call: ApiCall,
    client: Any,
    renew: Callable[[Any], Awaitable[Any]],
    policy: RetryPolicy = DEFAULT_POLICY,
) -> tuple[Answer, Any]:
    """:func:`send` for ``kubernetes_asyncio``: returns the answer and the client to go on
    with (``renew(stale)`` closes a refused client and returns a fresh one)."""
    state = _CallState(call, _async_transport_errors())
    current = client

    async def once(what: ApiCall) -> Answer:
        nonlocal current
        answer = await call_async(current, what)
        if answer.status == 401 and not state.renewed:
            state.renewed = True
            log.info("Kubernetes API answered 401; refreshing credentials and retrying once")
            current = await renew(current)
            answer = await call_async(current, what)
        return answer

    async def attempt() -> Answer:
        answer = await once(call)
        if state.wants_readback(answer) and (read := state.readback()) is not None:
            answer = state.adopt(answer, await once(read), read)
        return state.judge(answer)

    kwargs = _tenacity_kwargs(policy, state)
    kwargs["sleep"] = policy.asleep if policy.asleep is not None else asyncio.sleep
    try:
        answer = await tenacity.AsyncRetrying(**kwargs)(attempt)
    except BaseException:
        if current is not client:  # a renewed client the caller never receives
            await current.close()
        raise
    return answer, current
