"""Sending one Kubernetes API call: transient failures retried, a stale token renewed.

The GKE backend's drivers (``GkeBackend._send`` / ``_asend``) hand every call here
(:func:`send`, :func:`asend`), so creates, status reads, log reads and deletes, sync
and async, share one policy:

* **429, 500, 502, 503, 504 and lost connections** (reset, refused, cut short) are
  retried with exponential backoff and jitter (tenacity, as providers-cncf-kubernetes
  does); a ``Retry-After`` header is honoured (capped).  When the budget is spent the
  last answer is returned (the caller's error then names the status, and the message
  says how many attempts were made) or the last connection error is raised.
* **401** means the bearer token went stale (GKE tokens last an hour): the client is
  rebuilt once (``renew``) and the call repeated at once; a second 401 is the answer.
* **A create is not repeated into a duplicate**: a 409 after a create that may have
  happened is settled by reading the object back
  (:mod:`~airflow_provider_kinetic.core.backends.k8s.create`).

Sending one request and telling a transient answer or a lost connection from the rest
lives in :mod:`~airflow_provider_kinetic.core.backends.k8s.transport`; its public names
(:class:`Answer`, :func:`call_sync`, :data:`TRANSIENT_STATUSES`, ...) are re-exported
here.

The policy (:class:`RetryPolicy`) is small by default and per backend
(``backend.retry_policy``); the Airflow layer sets it from ``[kinetic]`` options and
tests pass a recording ``sleep`` so nothing waits for real.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.backends.k8s.create import CallState
from airflow_provider_kinetic.core.backends.k8s.transport import (
    TRANSIENT_STATUSES,
    Answer,
    ApiCall,
    Transient,
    async_transport_errors,
    call_async,
    call_sync,
    retry_after_s,
    sync_transport_errors,
)

__all__ = [
    "DEFAULT_POLICY",
    "TRANSIENT_STATUSES",
    "Answer",
    "ApiCall",
    "RetryPolicy",
    "asend",
    "call_async",
    "call_sync",
    "policy_for",
    "retry_after_s",
    "send",
]

log = logging.getLogger(__name__)


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


def _wait(policy: RetryPolicy) -> Callable[[tenacity.RetryCallState], float]:
    backoff = tenacity.wait_exponential_jitter(
        initial=policy.wait_initial_s, max=policy.wait_max_s, jitter=policy.wait_initial_s
    )

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Transient) and exc.answer.retry_after is not None:
            return min(exc.answer.retry_after, policy.retry_after_max_s)
        return min(backoff(state), policy.wait_max_s)

    return wait


def _describe(call: ApiCall) -> str:
    return f"{call.api}.{call.method}"


def _tenacity_kwargs(policy: RetryPolicy, state: CallState) -> dict[str, Any]:
    def should_retry(exc: BaseException) -> bool:
        return isinstance(exc, Transient) or state.lost(exc)

    def before_sleep(retry: tenacity.RetryCallState) -> None:
        exc = retry.outcome.exception() if retry.outcome else None
        what = f"HTTP {exc.answer.status}" if isinstance(exc, Transient) else repr(exc)
        status = str(exc.answer.status) if isinstance(exc, Transient) else "connection"
        metrics.incr(
            "kinetic.k8s.api_retries", 1, {"call": _describe(state.call), "status": status}
        )
        wait = retry.next_action.sleep if retry.next_action else 0.0
        log.warning(
            "Kubernetes API %s: %s; attempt %d of %d, retrying in %.2f s",
            _describe(state.call),
            what,
            retry.attempt_number,
            policy.attempts,
            wait,
        )

    def give_up(retry: tenacity.RetryCallState) -> Answer:
        exc = retry.outcome.exception() if retry.outcome else None
        if isinstance(exc, Transient):
            note = f"gave up after {retry.attempt_number} attempts"
            log.warning(
                "Kubernetes API %s: HTTP %d, %s", _describe(state.call), exc.answer.status, note
            )
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
    state = CallState(call, sync_transport_errors())

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


async def asend(
    call: ApiCall,
    client: Any,
    renew: Callable[[Any], Awaitable[Any]],
    policy: RetryPolicy = DEFAULT_POLICY,
) -> tuple[Answer, Any]:
    """:func:`send` for ``kubernetes_asyncio``: returns the answer and the client to go on
    with (``renew(stale)`` closes a refused client and returns a fresh one)."""
    state = CallState(call, async_transport_errors())
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
