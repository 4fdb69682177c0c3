"""What one Kubernetes API call has seen across its attempts: a create is not repeated
into a duplicate.

:mod:`~airflow_provider_kinetic.core.backends.k8s.retry` keeps one :class:`CallState`
per logical call.  It judges each answer (a transient one is raised as
:class:`~airflow_provider_kinetic.core.backends.k8s.transport.Transient` for tenacity to
retry), tells a lost connection from other errors, and remembers whether the stale
token was already renewed once.

Its main charge is the create.  A create whose answer was lost (5xx, dropped
connection) may have happened; when its retry answers 409 AlreadyExists, the object is
read back (:func:`_readback` derives the read from the create) and, if it carries the
labels that were sent, it is taken as created (its body is the answer, as a 201 would
have been).  Admission may add labels of its own; an object missing one of ours is
someone else's of the same name, and the 409 stands.  The labels sent include the
owner token (``kinetic-owner``, :mod:`~airflow_provider_kinetic.core.backends.k8s.ownership`)
when the backend has the deployment secret, so a look-alike with copied labels is not
taken as ours.  A 429 means the create was
throttled before it happened, so it alone does not call for a read-back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.transport import (
    TRANSIENT_STATUSES,
    Answer,
    ApiCall,
    Transient,
    is_tls_failure,
)

log = logging.getLogger(__name__)


class CallState:
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
        if not isinstance(exc, self.transport_errors) or is_tls_failure(exc):
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
            raise Transient(answer)
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
