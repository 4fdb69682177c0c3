"""Job identity on the wire: ``JobHandle``, ``JobStatus`` (+ ``StatusReport``), job ids.

A handle travels as a plain JSON dict (XCom, trigger kwargs, ``handle.json``): kinetic
0.0.4's ``JobHandle.to_dict()`` keys plus our additive ``version`` and ``output_dir``.
In code it is the typed :class:`JobHandle`; ``to_dict``/``from_dict`` are the only
converters, and keys a newer version added are kept in ``extra`` so a round trip
through an older worker loses nothing.
"""

from __future__ import annotations

import ast
import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError

HANDLE_VERSION = 1

#: kinetic's JobHandle fields, in order; all but the group fields are required.
HANDLE_FIELDS = (
    "job_id",
    "backend",
    "project",
    "cluster_name",
    "zone",
    "namespace",
    "bucket_name",
    "k8s_name",
    "image_uri",
    "accelerator",
    "func_name",
    "display_name",
    "created_at",
)
GROUP_FIELDS = ("group_id", "group_kind", "group_index")
#: Keys without which a dict cannot name a job at all.
_ESSENTIAL = ("job_id", "backend", "bucket_name")


class InvalidHandleError(KineticError, TypeError):
    """A value read back from XCom, a template or ``handle.json`` is not a JobHandle."""


class JobStatus(enum.StrEnum):
    """Lifecycle of one job; values equal the names (as kinetic's enum)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    NOT_FOUND = "NOT_FOUND"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.NOT_FOUND)


#: Reasons (``StatusReport.reason``) that mean the platform took the machine away, on
#: any backend: retried apart from the function's own failures, on a budget of their own.
REASON_EVICTED = "Evicted"
REASON_PREEMPTED = "Preempted"
PREEMPTION_REASONS = frozenset({REASON_PREEMPTED, REASON_EVICTED})
#: A capacity step whose pods stayed unschedulable (or unadmitted) past its wait while
#: nothing of the job started: the task goes on with its next step (``core.capacity``).
REASON_NO_CAPACITY = "NoCapacity"


@dataclass(frozen=True)
class StatusReport:
    """A status plus the reason a person needs to act on it (shown in the task log)."""

    status: JobStatus
    reason: str | None = None
    message: str = ""

    def describe(self) -> str:
        text = self.status.value
        if self.reason:
            text += f" ({self.reason})"
        if self.message:
            text += f": {self.message}"
        return text


@dataclass(frozen=True)
class JobHandle:
    """Everything needed to find a job again from any process (kinetic's JobHandle).

    Required kinetic fields are strings (kinetic writes ``""`` for a missing project
    on the local backend).  ``output_dir``, ``result_auth`` (how the result is
    authenticated: ``hmac-sha256`` by this package's runner, ``none`` for a job
    submitted for kinetic's own runner; a claim, never a decision: a deployment with
    a signing secret verifies every result, ``deployment/signing.py``), ``result_key_id``
    (the id of the signing secret the job's result key came from,
    ``core.jobs.signing.key_id``; not secret) and ``version`` are ours; ``extra`` holds
    keys this version does not know, written back unchanged by ``to_dict``.
    """

    job_id: str
    backend: str
    bucket_name: str
    project: str = ""
    cluster_name: str = ""
    zone: str = ""
    namespace: str = "default"
    k8s_name: str = ""
    image_uri: str = ""
    accelerator: str = "cpu"
    func_name: str = ""
    display_name: str = ""
    created_at: str = ""
    group_id: str | None = None
    group_kind: str | None = None
    group_index: int | None = None
    debug: bool = False
    output_dir: str | None = None
    result_auth: str = "hmac-sha256"
    result_key_id: str | None = None
    #: The capacity step this job was created with (``core.capacity``: "spot",
    #: "reservation:r1", ...); None: a job from before capacity kinds (on-demand/spot).
    capacity: str | None = None
    #: Seconds this job may stay unschedulable (never started) before the task moves on
    #: to its next capacity step; None: no step left (``schedule_timeout_s`` applies).
    capacity_wait_s: float | None = None
    #: TPU slices the job runs on (a JobSet); None: one slice (every older handle).
    num_slices: int | None = None
    #: A debug job's debugpy port (``debug`` is then True; ``core.spec.debug``).
    debug_port: int | None = None
    version: int = HANDLE_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The wire dict: kinetic's keys in kinetic's order, then ours, then ``extra``."""
        out: dict[str, Any] = {
            k: "" if (v := getattr(self, k)) is None else v for k in HANDLE_FIELDS
        }
        for key in GROUP_FIELDS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["debug"] = bool(self.debug)
        if self.output_dir is not None:
            out["output_dir"] = self.output_dir
        out["result_auth"] = self.result_auth
        if self.result_key_id is not None:
            out["result_key_id"] = self.result_key_id
        for key in ("capacity", "capacity_wait_s", "num_slices", "debug_port"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["version"] = self.version
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_dict(cls, value: Any) -> JobHandle:
        """Read a wire dict (or a JobHandle); unknown keys are kept in ``extra``."""
        if isinstance(value, JobHandle):
            return value
        if not isinstance(value, Mapping):
            raise InvalidHandleError(
                f"a kinetic job handle must be a dict, got {type(value).__name__}: {value!r}"
            )
        missing = [k for k in _ESSENTIAL if not value.get(k)]
        if missing:
            raise InvalidHandleError(f"job handle is missing {', '.join(missing)}: {value!r}")
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in value.items() if k in known}
        if kwargs.get("group_index") is not None:
            kwargs["group_index"] = int(kwargs["group_index"])
        extra = {k: v for k, v in value.items() if k not in known}
        return cls(**kwargs, extra=extra)

    def to_json(self) -> bytes:
        """``handle.json`` bytes exactly as kinetic writes them (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True).encode("utf-8")

    def evolve(self, **changes: Any) -> JobHandle:
        return replace(self, **changes)


def parse_rendered(text: str) -> Any:
    """A handle as a template renders it: JSON, or the Python literal Jinja makes of a
    dict (single quotes, ``True``), read as such, never by editing quotes.

    Raises:
        ValueError | SyntaxError: neither.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex[:8]


def new_group_id() -> str:
    return "grp-" + uuid.uuid4().hex[:8]


def utc_now_iso() -> str:
    """ISO-8601 UTC at seconds precision with a ``Z`` suffix (kinetic's created_at)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def artifact_key(job_id: str, name: str) -> str:
    """Key of a job artifact in the jobs bucket: ``{job_id}/{name}``."""
    return f"{job_id}/{name}"
