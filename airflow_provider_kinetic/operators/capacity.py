"""The operators' capacity options: ``capacity``, ``capacity_wait``, ``priority_class``
and ``max_run_duration``, checked when the DAG is parsed (unless templated) and
rendered into the request (``core.capacity`` does the checking)."""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import with_spot
from airflow_provider_kinetic.core.catalog.capacity import (
    DEFAULT_CAPACITY_WAIT_S,
    chain_for,
    seconds,
)
from airflow_provider_kinetic.core.catalog.capacity_gke import FLEX_START_MAX_RUN_S
from airflow_provider_kinetic.core.catalog.multislice import check_num_slices
from airflow_provider_kinetic.core.jobs.retry_on import parse_retry_on
from airflow_provider_kinetic.core.spec.failure import FailureClass

#: Template fields of the capacity options (both operators render them).
CAPACITY_TEMPLATE_FIELDS = ("capacity", "capacity_wait", "max_run_duration", "priority_class")


def _templated(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list | tuple):
        return any(_templated(v) for v in value)
    return False


def check_options(
    accelerator: Any, spot: bool, capacity: Any, capacity_wait: Any, max_run_duration: Any
) -> None:
    """Parse-time checks: a bad kind, an empty name, a repeated step, a wait <= 0 or a
    kind GKE does not offer for the accelerator fails the DAG import, naming the value.
    Templated values are checked once rendered (``request_fields``)."""
    if not _templated(capacity_wait):
        seconds(capacity_wait, "capacity_wait")
    if max_run_duration is not None and not _templated(max_run_duration):
        seconds(max_run_duration, "max_run_duration", FLEX_START_MAX_RUN_S)
    if capacity is None or _templated(capacity) or _templated(accelerator):
        return
    if not isinstance(accelerator, str):
        return  # the accelerator's own check says what is wrong with it
    chain_for(capacity, with_spot(accelerator, spot))


def request_fields(
    capacity: Any, capacity_wait: Any, priority_class: Any, max_run_duration: Any
) -> dict[str, Any]:
    """The rendered options as ``JobRequest`` fields (a bad rendered value raises)."""
    wait = DEFAULT_CAPACITY_WAIT_S if capacity_wait in (None, "") else capacity_wait
    limit = FLEX_START_MAX_RUN_S
    return {
        "capacity": capacity if capacity not in ("", []) else None,
        "capacity_wait_s": seconds(wait, "capacity_wait"),
        "priority_class": priority_class or None,
        "max_run_duration_s": None
        if max_run_duration in (None, "")
        else seconds(max_run_duration, "max_run_duration", limit),
    }


def slices_value(num_slices: Any) -> Any:
    """A rendered ``num_slices`` as an int (a template renders ``"4"`` as text)."""
    if isinstance(num_slices, str) and num_slices.strip().isdigit():
        return int(num_slices)
    return num_slices


def check_slices(accelerator: Any, spot: bool, num_slices: Any) -> None:
    """Parse-time check of ``num_slices`` against the accelerator (unless either is
    templated): GPUs, CPU and TPU slices GKE cannot join fail the DAG import."""
    if _templated(num_slices) or _templated(accelerator) or not isinstance(accelerator, str):
        return
    check_num_slices(slices_value(num_slices), with_spot(accelerator, spot))


def gang_restarts(op: Any) -> int:
    """A multi-slice job's restarts of the whole gang in place (JobSet ``maxRestarts``):
    the task's preemption and infra re-submits (``retry_on``), which the JobSet spends
    (``operators.takeover`` then re-submits neither); 0 for one slice."""
    if op.slice_count() == 1 or not hasattr(op, "retry_on"):
        return 0
    policy = parse_retry_on(op.retry_on, preemption_retries=op.preemption_retries)
    return policy.budget(FailureClass.PREEMPTION) + policy.budget(FailureClass.INFRA)
