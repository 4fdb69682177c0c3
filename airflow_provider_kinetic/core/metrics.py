"""Metrics the core emits, into a sink that does nothing until the Airflow layer sets one.

The numbers worth counting are seen in the core (data cache hits, bytes uploaded,
stat cache hits, Kubernetes API retries, result sizes, a batch child's preemption or
capacity step), but the core never imports Airflow, whose stats client (StatsD,
Datadog or OpenTelemetry, as ``[metrics]`` configures it) is where they must go.  So
the core calls :func:`incr` / :func:`timing` / :func:`gauge` here, and
``deployment/metrics.py`` registers a *resolver* when the Airflow layer is imported: the
first emission in a process asks it for the sink once (``None`` when Airflow's metrics
are off), and every later call goes straight to that answer.  The runner in a pod and
plain Python use of the core never load the Airflow layer: every call is a no-op there.

Cost when off: two module-global reads and a return.  Hot call sites pass a constant
name and no tags, so nothing is allocated; a call site that builds a tag dict does it
on a rare path (a retry, a preemption) or behind :func:`enabled`.

Tags: a call's own, over the *scope* (a context variable: a trigger sets its task's
dag and task ids, accelerator and backend with :func:`set_scope`, so each trigger in
the triggerer's shared event loop tags what it emits with its own task).  The sink adds
what the running Airflow task says where neither does.  A metric must never fail a
job: a sink that raises is logged at debug level and the job goes on.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

log = logging.getLogger(__name__)

#: Every metric's name starts with this (the stats client adds ``[metrics]
#: statsd_prefix`` / ``otel_prefix`` in front: ``airflow.kinetic.job.run``).
PREFIX = "kinetic."

Tags = Mapping[str, str]


class Sink(Protocol):
    """Where metrics go: the Airflow layer's adapter of Airflow's stats client."""

    def incr(self, name: str, count: int, tags: Tags) -> None: ...

    def timing(self, name: str, seconds: float, tags: Tags) -> None: ...

    def gauge(self, name: str, value: float, tags: Tags) -> None: ...


_EMPTY: Tags = MappingProxyType({})
_sink: Sink | None = None
_resolver: Callable[[], Sink | None] | None = None
_lock = threading.RLock()
_scope: contextvars.ContextVar[Tags] = contextvars.ContextVar(
    "kinetic_metric_scope", default=_EMPTY
)


def set_resolver(resolver: Callable[[], Sink | None]) -> None:
    """How to make the sink, asked on the first emission in this process (once).  An
    installed sink stays: a resolver registered later changes nothing."""
    global _resolver
    with _lock:
        if _sink is None:
            _resolver = resolver


def install(sink: Sink | None) -> None:
    """Set the sink now (``None``: metrics off in this process); the resolver is dropped."""
    global _sink, _resolver
    with _lock:
        _sink, _resolver = sink, None


def _current() -> Sink | None:
    """The sink, resolving it first when a resolver is pending (under the lock: threads
    of an upload pool may emit at once; the resolver runs exactly once)."""
    global _sink, _resolver
    if _resolver is None:
        return _sink
    with _lock:
        resolver, _resolver = _resolver, None
        if resolver is not None:
            try:
                _sink = resolver()
            except Exception as exc:  # noqa: BLE001 - metrics off, never the job's outcome
                log.debug("kinetic metrics are off: the sink could not be made: %s", exc)
                _sink = None
        return _sink


def enabled() -> bool:
    """Whether metrics go anywhere in this process (resolves the sink on first use):
    call sites guard work done only for a metric (a size summed, a record read)."""
    if _sink is None and _resolver is None:
        return False
    return _current() is not None


def set_scope(tags: Tags) -> contextvars.Token[Tags]:
    """Tag everything emitted from this context on (the current thread or asyncio task,
    and threads started with a copy of its context).  Returns the token to reset with."""
    return _scope.set(MappingProxyType(dict(tags)))


def reset_scope(token: contextvars.Token[Tags]) -> None:
    _scope.reset(token)


def _tags(tags: Tags | None) -> Tags:
    scope = _scope.get()
    if not tags:
        return scope
    return {**scope, **tags} if scope else tags


def incr(name: str, count: int = 1, tags: Tags | None = None) -> None:
    """Add ``count`` to the counter ``name``."""
    _send("incr", name, count, tags)


def timing(name: str, seconds: float, tags: Tags | None = None) -> None:
    """One sample of the timer ``name`` (seconds here; the sink sends milliseconds)."""
    _send("timing", name, seconds, tags)


def gauge(name: str, value: float, tags: Tags | None = None) -> None:
    """Set the gauge ``name`` to ``value``."""
    _send("gauge", name, value, tags)


def _send(kind: str, name: str, value: float, tags: Tags | None) -> None:
    if _sink is None and _resolver is None:  # no Airflow layer here: nothing to do
        return
    sink = _current()
    if sink is not None:
        try:
            getattr(sink, kind)(name, value, _tags(tags))
        except Exception as exc:  # noqa: BLE001 - a metric never fails a job
            log.debug("kinetic metric %s not sent: %s", name, exc)
