"""Capacity kinds: how a job's pods get their accelerators on GKE, and fallback chains.

``capacity=`` names one way of getting capacity, or a chain of them tried in order:
``on-demand`` (the default), ``spot``, ``flex-start`` (Dynamic Workload Scheduler),
``reservation:NAME`` / ``reservation:PROJECT/NAME`` (a specific, maybe shared,
reservation), ``queue:NAME`` (a Kueue LocalQueue) and ``class:NAME`` (a GKE custom
compute class).  Each kind is a set of pod fields (``pod_fields``), which the pod builder
adds to the accelerator's own; the GKE facts behind them live in ``capacity_gke``.

Everything here runs before anything is packed or uploaded: a bad kind, an empty name,
a chain that repeats a step or a kind GKE does not offer for the accelerator fails with
an error naming the value and the allowed forms.  Stdlib-only, like the parser.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator, parse_accelerator
from airflow_provider_kinetic.core.catalog.capacity_gke import (
    CLASS_REPLACES,
    FLEX_START_MAX_RUN_S,
    FLEX_START_TPUS,
    MAX_RUN_ANNOTATION,
    capacity_selectors,
    capacity_tolerations,
    queue_labels,
)
from airflow_provider_kinetic.core.durations import duration_s
from airflow_provider_kinetic.core.errors import KineticError

#: Every capacity kind ``capacity=`` accepts, in the order the CLI lists them.
CAPACITY_KINDS = ("on-demand", "spot", "flex-start", "reservation", "queue", "class")
DEFAULT_CAPACITY = "on-demand"
#: How long one step of a chain may stay unschedulable before the next is tried.
DEFAULT_CAPACITY_WAIT_S = 15 * 60.0

ALLOWED_FORMS = (
    '"on-demand", "spot", "flex-start", "reservation:NAME", "reservation:PROJECT/NAME", '
    '"queue:NAME", "class:NAME", or a list of them tried in order (no step twice)'
)
_NAMED = ("reservation", "queue", "class")
# Reservation, queue and compute class names end up as node selector and label values:
# RFC 1035 labels (lowercase, digits, '-'; at most 63), as GCE and Kubernetes name them.
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# Google Cloud project ids: 6 to 30 characters, a letter first, no trailing hyphen.
_PROJECT_RE = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")


class InvalidCapacityError(KineticError, ValueError):
    """A ``capacity=`` value (or a wait, or a duration) that cannot be used as given."""

    def __init__(self, value: object, reason: str, allowed: str = ALLOWED_FORMS) -> None:
        self.value, self.reason, self.allowed = value, reason, allowed
        super().__init__(f"Invalid capacity {value!r}: {reason}. Allowed: {allowed}.")

    def __reduce__(self) -> tuple[type[InvalidCapacityError], tuple[object, str, str]]:
        return (type(self), (self.value, self.reason, self.allowed))


@dataclass(frozen=True)
class Capacity:
    """One step: a kind and, for the named kinds, the name (and a shared reservation's
    project)."""

    kind: str
    name: str | None = None
    project: str | None = None

    def __str__(self) -> str:
        if self.kind not in _NAMED:
            return self.kind
        return (
            f"{self.kind}:{self.project}/{self.name}"
            if self.project
            else f"{self.kind}:{self.name}"
        )

    @property
    def describe(self) -> str:
        """What a person reads in the task log ("reservation r1 of project p")."""
        if self.kind == "reservation":
            shared = f" (shared from project {self.project})" if self.project else ""
            return f"reservation {self.name}{shared}"
        if self.kind == "queue":
            return f"Kueue queue {self.name}"
        if self.kind == "class":
            return f"compute class {self.name}"
        return {"flex-start": "flex-start (DWS)"}.get(self.kind, self.kind)


def parse_capacity(value: Any) -> Capacity:
    """One step from its text form (case and surrounding blanks ignored)."""
    if not isinstance(value, str):
        raise InvalidCapacityError(value, f"expected a string, got {type(value).__name__}")
    text = value.strip().lower()
    kind, sep, rest = text.partition(":")
    if kind in ("on-demand", "spot", "flex-start") and not sep:
        return Capacity(kind)
    if kind not in _NAMED:
        raise InvalidCapacityError(value, f"unknown capacity kind {kind or text!r}")
    if not rest.strip():
        raise InvalidCapacityError(value, f"{kind!r} needs a name after the colon")
    project, slash, name = rest.strip().rpartition("/")
    if slash and kind != "reservation":
        raise InvalidCapacityError(value, f"only a reservation may name a project ({kind!r})")
    if not _NAME_RE.fullmatch(name):
        raise InvalidCapacityError(
            value,
            f"{name!r} is not a valid {kind} name (lowercase letters, digits and '-', "
            "a letter first, at most 63 characters)",
        )
    if slash and not _PROJECT_RE.fullmatch(project):
        raise InvalidCapacityError(value, f"{project!r} is not a Google Cloud project id")
    return Capacity(kind, name, project or None)


def parse_chain(value: Any, spot: bool = False) -> tuple[Capacity, ...]:
    """A ``capacity=`` value (one step or a list) as its steps, in order.

    ``spot``: the accelerator's ``:spot`` suffix or ``spot=True``; it means the same as
    ``capacity="spot"``, so it may only stand with no capacity, ``"spot"`` or
    ``"on-demand"`` (the default).  ``None`` is the default, on-demand (or spot).
    """
    if value is None or value == "":
        return (Capacity("spot" if spot else DEFAULT_CAPACITY),)
    steps = [value] if isinstance(value, str) else value
    if not isinstance(steps, list | tuple) or not steps:
        raise InvalidCapacityError(value, "expected one capacity or a non-empty list of them")
    chain = tuple(parse_capacity(step) for step in steps)
    seen: set[str] = set()
    for step in chain:
        if str(step) in seen:
            raise InvalidCapacityError(value, f"the step {str(step)!r} appears twice")
        seen.add(str(step))
    if spot:
        if len(chain) == 1 and chain[0].kind in ("on-demand", "spot"):
            return (Capacity("spot"),)
        raise InvalidCapacityError(
            value,
            "spot=True (or a ':spot' accelerator) conflicts with capacity "
            f'{[str(s) for s in chain]}; put "spot" in the capacity list instead',
        )
    return chain


def supported_kinds(accelerator: Accelerator) -> tuple[str, ...]:
    """The capacity kinds GKE offers for ``accelerator`` (``capacity_gke`` cites why)."""
    return tuple(kind for kind in CAPACITY_KINDS if _unsupported(accelerator, kind) is None)


def _unsupported(accelerator: Accelerator, kind: str) -> str | None:
    """Why GKE does not offer ``kind`` for ``accelerator``; None when it does."""
    if kind != "flex-start":
        return None
    if accelerator.kind == "cpu":
        return "flex-start provisions GPUs and TPUs, not CPU-only nodes"
    if accelerator.kind == "tpu" and accelerator.name not in FLEX_START_TPUS:
        allowed = ", ".join(sorted(FLEX_START_TPUS))
        return f"GKE offers flex-start for TPU {allowed}, not {accelerator.name}"
    if accelerator.kind == "tpu" and accelerator.is_multi_host:
        return (
            "flex-start without queued provisioning runs single-host TPU slices only; "
            "ask for a single-host slice, or a Kueue queue (queue:NAME) whose ClusterQueue "
            "uses queued provisioning"
        )
    return None


def check_chain(chain: Iterable[Capacity], accelerator: Accelerator, accel_text: str) -> None:
    """Fail, naming the accelerator, the step and what is allowed, when GKE does not
    offer a step of ``chain`` for ``accelerator``."""
    for step in chain:
        why = _unsupported(accelerator, step.kind)
        if why:
            allowed = ", ".join(supported_kinds(accelerator))
            raise InvalidCapacityError(
                str(step),
                f"{why} (accelerator {accel_text!r})",
                f"capacity kinds for {accel_text!r}: {allowed}",
            )


def chain_for(capacity: Any, accelerator: str, default: Any = None) -> tuple[Capacity, ...]:
    """The steps of ``capacity`` (``default``, the connection's, when it is None) for the
    accelerator string ``accelerator`` (its ``:spot`` included), checked against what
    GKE offers for it: the one way a task's chain is read, at parse time, when planned
    and when a step is given up."""
    accel = parse_accelerator(accelerator)
    chain = parse_chain(default if capacity is None else capacity, spot=accel.spot)
    check_chain(chain, accel, accelerator)
    return chain


def seconds(value: Any, what: str, limit_s: float | None = None) -> float:
    """A duration (seconds as a number or text, ``"15m"``/``"2h"``/``"7d"``, a
    ``timedelta``) in seconds; above zero, and at most ``limit_s`` when given."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    elif isinstance(value, str) and (parsed := duration_s(value, lenient=True)) is not None:
        result = parsed
    else:
        raise InvalidCapacityError(
            value, f"{what} is not a duration", 'seconds (900), "15m", "2h", "7d" or a timedelta'
        )
    if result <= 0:
        raise InvalidCapacityError(value, f"{what} must be above zero", "a positive duration")
    if limit_s is not None and result > limit_s:
        raise InvalidCapacityError(
            value, f"{what} is over GKE's limit of {limit_s:.0f} s", f"at most {limit_s:.0f} s"
        )
    return result


@dataclass(frozen=True)
class CapacityFields:
    """What one step adds to a pod and to the object that owns it (Job / LWS)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    #: Labels and annotations of the Job / LeaderWorkerSet itself (Kueue reads there).
    owner_labels: dict[str, str] = field(default_factory=dict)
    owner_annotations: dict[str, str] = field(default_factory=dict)
    #: Create the Job suspended: Kueue unsuspends it when the queue admits it.
    suspend: bool = False
    #: The pod's ``activeDeadlineSeconds`` (flex-start: its VM's run limit).
    deadline_s: int | None = None
    #: Node selector keys of the accelerator this step replaces (a compute class).
    replaces: frozenset[str] = frozenset()


def pod_fields(
    step: Capacity | None,
    *,
    priority_class: str | None = None,
    max_run_duration_s: float | None = None,
) -> CapacityFields:
    """The fields of ``step`` (spot comes from the accelerator's own ``:spot`` fields,
    so it adds nothing here; on-demand adds nothing at all)."""
    if step is None or step.kind in ("on-demand", "spot"):
        return CapacityFields()
    selector = capacity_selectors(step.kind, step.name, step.project)
    tolerations = capacity_tolerations(step.kind)
    if step.kind == "flex-start":
        limit = max_run_duration_s or FLEX_START_MAX_RUN_S
        return CapacityFields(selector, tolerations, deadline_s=int(limit))
    if step.kind == "queue":
        annotations = {}
        if max_run_duration_s:  # read by the queue's ProvisioningRequest admission check
            annotations[MAX_RUN_ANNOTATION] = str(int(max_run_duration_s))
        labels = queue_labels(step.name, priority_class)
        return CapacityFields(selector, tolerations, labels, annotations, suspend=True)
    if step.kind == "class":
        return CapacityFields(selector, tolerations, replaces=CLASS_REPLACES)
    return CapacityFields(selector, tolerations)
