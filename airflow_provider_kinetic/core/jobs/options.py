"""A job's options as one typed record, written once: operator -> request -> template -> pod.

:class:`JobOptions` holds the options that say how and where a job runs (accelerator
and spot, resource requests, labels, the capacity chain and its waits, Kueue priority,
flex-start's run limit, checkpoint syncing and restoring, the number of TPU slices).
It checks itself when made (a bad value fails naming itself and the allowed forms,
before anything is packed) and travels unchanged: ``JobRequest.options`` ->
``JobTemplate.options`` (its wire form flattens the record's fields) -> the pod
builder's inputs.

Each field says, in its metadata, two things the rest of the path reads by construction:

- ``work``: how the work digest (``core.jobs.work``) covers it.  :data:`ALWAYS`: always
  written (the options the digest has covered from its first version); :data:`WHEN_SET`
  (the default for a new field): written only when it differs from its default, so
  adding an option leaves every digest made before as it was and an unchanged retry
  across an upgrade still adopts its job; :data:`NOT_WORK`: where or how the job runs,
  not what it computes (a later try that only changes it adopts the earlier job).
- ``pod``: the ``core.spec.pod.SpecInputs`` field it feeds, if any.

So a new option is one field here plus its use (and the operator parameter).
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator, with_spot
from airflow_provider_kinetic.core.catalog.capacity import (
    DEFAULT_CAPACITY_WAIT_S,
    Capacity,
    chain_for,
    seconds,
)
from airflow_provider_kinetic.core.catalog.capacity_gke import FLEX_START_MAX_RUN_S
from airflow_provider_kinetic.core.catalog.multislice import SINGLE_SLICE, check_num_slices
from airflow_provider_kinetic.core.jobs.checkpoint import (
    DEFAULT_SYNC_S,
    RESTORE_SAME_WORK,
    validate_restore,
    validate_sync_s,
)
from airflow_provider_kinetic.core.spec.debug import (
    DEFAULT_DEBUG_PORT,
    DEFAULT_DEBUG_WAIT_S,
    check_debug,
)

#: ``work`` metadata: always in the work digest (the digest's options since version 1).
ALWAYS = "always"
#: ``work`` metadata (the default): in the work digest when not its default value.
WHEN_SET = "when-set"
#: ``work`` metadata: not in the work digest (it does not change what the job computes).
NOT_WORK = "not-work"

# A Kubernetes quantity ("500m", "2", "1.5", "16Gi", "1e3").
_QUANTITY_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?")


def option(
    default: Any = MISSING,
    *,
    default_factory: Any = MISSING,
    work: str = WHEN_SET,
    pod: str | None = None,
) -> Any:
    """A :class:`JobOptions` field: how the work digest covers it (``work``) and the
    ``SpecInputs`` field it feeds (``pod``)."""
    if work not in (ALWAYS, WHEN_SET, NOT_WORK):
        raise ValueError(f"work must be one of {ALWAYS!r}, {WHEN_SET!r}, {NOT_WORK!r}")
    metadata = {"work": work, "pod": pod}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class JobOptions:
    """How and where one job (or every child of a batch) runs; checked when made.

    ``accelerator`` is kept in its canonical form: with kinetic's ``:spot`` suffix
    exactly when ``spot`` (either spelling asks for spot VMs), so equal options are
    equal records.
    """

    #: kinetic's accelerator string (``"cpu"``, ``"gpu-l4"``, ``"tpu-v5e-4:spot"``, ...).
    accelerator: str = option("cpu", work=ALWAYS)
    #: Spot VMs; the same as a ``:spot`` suffix on ``accelerator`` (kinetic has both).
    #: Not in the digest by itself: the canonical ``accelerator`` carries it.
    spot: bool = option(False, work=NOT_WORK)
    #: The container's CPU and memory requests (Kubernetes quantities) for jobs without
    #: an accelerator (an accelerator's requests follow from its shape).
    cpu: str | int | float | None = option(None, work=ALWAYS, pod="cpu_request")
    memory: str | int | float | None = option(None, work=ALWAYS, pod="memory_request")
    #: Extra labels of the job's pods (values made label-safe by ``core.spec.pod``).
    labels: dict[str, Any] = option(default_factory=dict, work=ALWAYS)
    #: One capacity kind or a fallback chain (``core.catalog.capacity``), kept as its
    #: steps' text; None: the connection's (on-demand, or spot with ``spot``).
    capacity: list[str] | None = option(None, work=NOT_WORK)
    #: How long one step may stay unschedulable before the next is tried.
    capacity_wait_s: float = option(DEFAULT_CAPACITY_WAIT_S, work=NOT_WORK)
    #: A Kueue WorkloadPriorityClass for ``queue:NAME`` steps.
    priority_class: str | None = option(None, work=NOT_WORK, pod="priority_class")
    #: Flex-start VMs' run limit in seconds; None: GKE's limit (seven days).
    max_run_duration_s: float | None = option(None, work=NOT_WORK, pod="max_run_duration_s")
    #: Seconds between the runner's syncs of ``KINETIC_CHECKPOINT_DIR`` to the store
    #: (``core.jobs.checkpoint``); it also syncs on SIGTERM and at exit.
    checkpoint_sync_s: float = option(DEFAULT_SYNC_S, work=NOT_WORK)
    #: Which checkpoint a job restores: ``"same_work"`` only one its own work wrote;
    #: ``"any"``: the task run's, whatever work wrote it.
    checkpoint_restore: str = option(RESTORE_SAME_WORK, work=NOT_WORK)
    #: How many identical TPU slices run the job together (JAX multi-slice, one JobSet);
    #: 1: one slice.  In the work digest only when more than one (``WHEN_SET``).
    num_slices: int = option(SINGLE_SLICE, pod="num_slices")
    #: A multi-slice job's restarts of the whole gang in place (JobSet
    #: ``failurePolicy.maxRestarts``): the task's preemption and infra re-submits.
    max_restarts: int = option(0, work=NOT_WORK, pod="max_restarts")
    #: Debug mode (``core.spec.debug``): the port the runner's debugpy server listens
    #: on, None: off; and how long it waits for a client before failing the job.
    debug_port: int | None = option(None, work=NOT_WORK, pod="debug_port")
    debug_wait_s: float = option(DEFAULT_DEBUG_WAIT_S, work=NOT_WORK, pod="debug_wait_s")

    def __post_init__(self) -> None:
        if not isinstance(self.spot, bool):
            raise TypeError(f"spot must be True or False, got {self.spot!r}")
        if not isinstance(self.accelerator, str):
            raise TypeError(
                "accelerator must be a string such as 'cpu', 'gpu-l4' or 'tpu-v5e-4:spot', "
                f"got {type(self.accelerator).__name__}: {self.accelerator!r}"
            )
        accelerator = with_spot(self.accelerator, self.spot)
        self._set("spot", parse_accelerator(accelerator).spot)  # names a bad accelerator
        self._set("accelerator", accelerator)
        for name in ("cpu", "memory"):
            _check_quantity(name, getattr(self, name))
        self._set("labels", _checked_labels(self.labels))
        if self.capacity is not None:
            self._set("capacity", [str(step) for step in self.capacity_chain])
        self._set("capacity_wait_s", seconds(self.capacity_wait_s, "capacity_wait_s"))
        if self.priority_class is not None and (
            not isinstance(self.priority_class, str) or not self.priority_class.strip()
        ):
            raise ValueError(
                "priority_class must be the name of a Kueue WorkloadPriorityClass or None, "
                f"got {self.priority_class!r}"
            )
        if self.max_run_duration_s is not None:
            limit = seconds(self.max_run_duration_s, "max_run_duration_s", FLEX_START_MAX_RUN_S)
            self._set("max_run_duration_s", limit)
        self._set("checkpoint_sync_s", validate_sync_s(self.checkpoint_sync_s))
        self._set("checkpoint_restore", validate_restore(self.checkpoint_restore))
        self._set("num_slices", check_num_slices(self.num_slices, self.accelerator))
        restarts = self.max_restarts
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ValueError(f"max_restarts must be a whole number >= 0, got {restarts!r}")
        port = DEFAULT_DEBUG_PORT if self.debug_port is None else self.debug_port
        debug = check_debug(self.debug_port is not None, port, self.debug_wait_s)
        self._set("debug_wait_s", debug.wait_s)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen record as it is made

    # ---- what the rest of the path reads ---------------------------------------------
    @property
    def capacity_chain(self) -> tuple[Capacity, ...]:
        """The capacity steps, checked against the accelerator (None: on-demand or spot)."""
        return chain_for(self.capacity, self.accelerator)

    def with_default_capacity(self, capacity: Any) -> JobOptions:
        """These options with ``capacity`` (the connection's) when they name none."""
        return (
            self if self.capacity is not None or capacity is None else self.but(capacity=capacity)
        )

    def resolved(self) -> JobOptions:
        """These options with the capacity chain spelled out (a template's form)."""
        return self.but(capacity=[str(step) for step in self.capacity_chain])

    def but(self, **changes: Any) -> JobOptions:
        """A copy with ``changes``, checked as any new record is."""
        return replace(self, **changes)

    def work_options(self) -> dict[str, Any]:
        """The fields the work digest covers, by their ``work`` metadata."""
        out: dict[str, Any] = {}
        for f in fields(self):
            how = f.metadata.get("work", WHEN_SET)
            value = getattr(self, f.name)
            if how == ALWAYS or (how == WHEN_SET and value != default_of(f)):
                out[f.name] = value
        return out

    def pod_inputs(self) -> dict[str, Any]:
        """The ``SpecInputs`` fields these options feed, by their ``pod`` metadata."""
        return {
            f.metadata["pod"]: getattr(self, f.name) for f in fields(self) if f.metadata.get("pod")
        }

    # ---- wire form (flat, inside a template's) ----------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> JobOptions:
        """The options among ``value``'s keys (absent ones: their defaults)."""
        return cls(**{name: value[name] for name in option_names() if name in value})


def option_names() -> frozenset[str]:
    """The names of :class:`JobOptions`' fields (its keys in a template's wire form)."""
    return frozenset(f.name for f in fields(JobOptions))


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _check_quantity(name: str, value: Any) -> None:
    if value is None or value == "":
        return
    ok = isinstance(value, str) and _QUANTITY_RE.fullmatch(value.strip())
    ok = ok or (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )
    if not ok or (not isinstance(value, str) and value < 0):
        raise ValueError(
            f"{name} must be a Kubernetes quantity such as '500m', '2', '16Gi' or a number, "
            f"got {value!r}"
        )


def _checked_labels(labels: Any) -> dict[str, Any]:
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise TypeError(f"labels must be a dict of name -> value, got {labels!r}")
    for key, value in labels.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"label names must be non-empty strings, got {key!r}")
        if not isinstance(value, str | int | float | bool):
            raise ValueError(
                f"label {key!r} must have a string or number value, got {type(value).__name__}"
            )
    return dict(labels)
