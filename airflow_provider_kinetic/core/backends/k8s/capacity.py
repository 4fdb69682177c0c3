"""When a capacity step is given up: pods unschedulable (or unadmitted) past its wait.

A job made for a step of a capacity chain carries ``capacity_wait_s`` in its handle
(``None`` on the last step).  Its status is read as any job's (``k8s/status.py``); this
module then turns a wait for capacity that has lasted longer than that into FAILED
with ``REASON_NO_CAPACITY``, which the operator answers with the next step.  Only
while nothing of the job ever started: a container that ran (even one that then
restarted) means the function may have run, and a second step could run it twice.
A cluster autoscaler that has just triggered a scale-up for the pod is given the
rest of ``schedule_timeout_s``: a node is on its way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.status import (
    REASON_NOT_ADMITTED,
    REASON_UNSCHEDULABLE,
    Limits,
    parse_time,
)
from airflow_provider_kinetic.core.spec.handles import REASON_NO_CAPACITY, JobStatus, StatusReport

#: Reasons that mean "waiting for capacity", never "the function failed".
WAITING_FOR_CAPACITY = frozenset({REASON_UNSCHEDULABLE, REASON_NOT_ADMITTED})
# Cluster autoscaler event reasons on a pod (https://github.com/kubernetes/autoscaler/
# blob/master/cluster-autoscaler/FAQ.md#what-events-are-emitted-by-ca).
SCALE_UP = "TriggeredScaleUp"
NO_SCALE_UP = "NotTriggerScaleUp"


def ever_started(pods: Sequence[dict[str, Any]]) -> bool:
    """Whether any container of these pods ever ran (running, terminated, restarted)."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in ("Running", "Succeeded", "Failed"):
            return True
        for cs in status.get("containerStatuses") or []:
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            if state.get("running") or state.get("terminated") or last.get("terminated"):
                return True
            if cs.get("restartCount"):
                return True
    return False


def waited_s(owner: dict[str, Any], now: datetime) -> float:
    """Seconds since the Job / LeaderWorkerSet was created (0 when the API gave no time)."""
    created = parse_time((owner.get("metadata") or {}).get("creationTimestamp"))
    return (now - created).total_seconds() if created else 0.0


def capacity_due(
    report: StatusReport,
    owner: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    now: datetime,
    wait_s: float | None,
) -> bool:
    """Whether the step's wait is over with nothing started (events may still say a
    scale-up is on its way: :func:`capacity_verdict` reads them)."""
    if wait_s is None or owner is None or report.status is JobStatus.RUNNING:
        return False
    if report.reason not in WAITING_FOR_CAPACITY:
        return False
    if ever_started(pods):
        return False
    # Past schedule_timeout_s the read says FAILED (Unschedulable): with a step left,
    # that is this step's end too, however long its own wait.
    return report.status is JobStatus.FAILED or waited_s(owner, now) >= wait_s


def capacity_verdict(
    report: StatusReport,
    owner: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    now: datetime,
    wait_s: float | None,
    limits: Limits,
    events: Iterable[dict[str, Any]] = (),
) -> StatusReport:
    """``report``, or FAILED / ``REASON_NO_CAPACITY`` once the step's wait is over."""
    if not capacity_due(report, owner, pods, now, wait_s):
        return report
    assert owner is not None and wait_s is not None
    waited = waited_s(owner, now)
    timeout = limits.schedule_timeout_s
    if _scale_up_in_sight(events) and (timeout is None or waited < timeout):
        return StatusReport(
            JobStatus.PENDING,
            report.reason,
            f"{report.message} (the cluster autoscaler is adding a node: waiting on)",
        )
    return StatusReport(
        JobStatus.FAILED,
        REASON_NO_CAPACITY,
        f"nothing started after {waited:.0f} s (capacity wait {wait_s:.0f} s): {report.message}",
    )


def _scale_up_in_sight(events: Iterable[dict[str, Any]]) -> bool:
    """The autoscaler's latest word on the pod is a triggered scale-up."""
    said = [e for e in events if e.get("reason") in (SCALE_UP, NO_SCALE_UP)]
    if not said:
        return False
    latest = max(said, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return latest.get("reason") == SCALE_UP
