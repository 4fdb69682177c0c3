"""Diagnose a multi-slice JobSet from the objects the API server returns.

Pure functions over camelCase dicts, like ``k8s/status.py`` (whose per-pod rules they
reuse): the JobSet's conditions say whether the gang finished; the pods of its current
restart attempt say which slice and host failed, or waits, and why.  Every message
about a pod names its slice and host (``slice 1 host 0``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.backends.k8s import status as k8s_status
from airflow_provider_kinetic.core.backends.k8s.manifests import (
    COMPLETION_INDEX,
    JOB_INDEX_LABEL,
    SLICE_JOB,
)
from airflow_provider_kinetic.core.spec.failure import USER_ERROR_EXIT
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport

#: The pod label with the JobSet restart attempt that made it (JobSet's ``RestartsKey``,
#: pkg/constants/constants.go).
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
#: The JobSet restarts the gang after a failure (its restart budget is not spent).
REASON_RESTARTING = "Restarting"


def slice_host(pod: dict[str, Any]) -> tuple[int, int]:
    """A pod's slice (its Job's index in the JobSet) and host (its completion index)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    host = (meta.get("annotations") or {}).get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    return _int(labels.get(JOB_INDEX_LABEL)), _int(host)


def where(pod: dict[str, Any]) -> str:
    slice_index, host = slice_host(pod)
    return f"slice {slice_index} host {host}"


def current_pods(jobset: dict[str, Any], pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of the JobSet's current restart attempt, by slice and host."""
    restarts = str((jobset.get("status") or {}).get("restarts") or 0)
    mine = [p for p in pods if _labels(p).get(RESTART_LABEL, restarts) == restarts]
    return sorted(mine, key=slice_host)


def leader_pod(pods: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Slice 0 host 0 (it writes the result; its log is the job's), newest first."""
    leaders = [p for p in pods if slice_host(p) == (0, 0)]
    return max(leaders, key=lambda p: _labels(p).get(RESTART_LABEL, ""), default=None)


def jobset_status(
    jobset: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    events: Iterable[dict[str, Any]] = (),
    *,
    now: datetime | None = None,
    limits: k8s_status.Limits | None = None,
) -> StatusReport:
    """Status of a multi-slice JobSet (``None`` = the API said 404)."""
    limits = limits or k8s_status.Limits()
    if jobset is None:
        return StatusReport(
            JobStatus.NOT_FOUND, k8s_status.REASON_NOT_FOUND, "the JobSet does not exist"
        )
    now = now or datetime.now(UTC)
    events = list(events)
    if _true(jobset, "Completed"):
        return StatusReport(JobStatus.SUCCEEDED)
    failed = _true(jobset, "Failed")
    restarts = (jobset.get("status") or {}).get("restarts") or 0
    budget = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts") or 0
    current = current_pods(jobset, pods)
    for pod in current:
        report = k8s_status.pod_failure(pod)
        if report is None:
            continue
        message = f"{where(pod)} (pod {_name(pod)}): {report.message}"
        if failed or restarts >= budget or _user_error(pod):  # the gang is not restarted
            return StatusReport(JobStatus.FAILED, report.reason, message)
        return StatusReport(
            JobStatus.RUNNING,
            REASON_RESTARTING,
            f"restart {restarts + 1} of at most {budget} after {message}",
        )
    if failed:
        cond = _condition(jobset, "Failed") or {}
        detail = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
        return StatusReport(
            JobStatus.FAILED, k8s_status.REASON_JOB_FAILED, detail or "the JobSet failed"
        )
    if not current:
        if _true(jobset, "Suspended") or (jobset.get("spec") or {}).get("suspend"):
            return StatusReport(
                JobStatus.PENDING, k8s_status.REASON_NOT_ADMITTED, "waiting for admission"
            )
        return _not_created(jobset, events, now, limits)
    stuck = []
    for pod in current:
        report = k8s_status.pod_pending(pod, now, limits, events)
        if report is not None:
            stuck.append(
                StatusReport(report.status, report.reason, f"{where(pod)}: {report.message}")
            )
    failing = [r for r in stuck if r.status is JobStatus.FAILED]
    if failing:
        return failing[0]
    phases = {(p.get("status") or {}).get("phase") for p in current}
    if phases <= {"Running", "Succeeded"}:
        return StatusReport(JobStatus.RUNNING)
    if stuck:  # a slice waits for capacity, an image, a mount, ...
        return StatusReport(JobStatus.PENDING, stuck[0].reason, stuck[0].message)
    waiting = next(p for p in current if (p.get("status") or {}).get("phase") != "Running")
    return StatusReport(JobStatus.PENDING, None, f"{where(waiting)} is starting")


def first_slice_job(jobset: dict[str, Any]) -> str:
    """The name of slice 0's Job (JobSet names it ``{jobset}-{replicated job}-0``)."""
    return f"{_name(jobset)}-{SLICE_JOB}-0"


def _not_created(
    jobset: dict[str, Any], events: list[dict[str, Any]], now: datetime, limits: k8s_status.Limits
) -> StatusReport:
    """No pod yet: a FailedCreate event on a slice's Job (a missing service account, a
    quota) says why, and past ``create_grace_s`` the job fails (as for a Job's pods)."""
    prefix = f"{_name(jobset)}-{SLICE_JOB}-"
    failures = [
        e
        for e in events
        if e.get("reason") == "FailedCreate"
        and str((e.get("involvedObject") or {}).get("name", "")).startswith(prefix)
    ]
    if not failures:
        return StatusReport(JobStatus.PENDING, None, "waiting for the slices' pods")
    created = k8s_status.parse_time((jobset.get("metadata") or {}).get("creationTimestamp"))
    age = (now - created).total_seconds() if created else 0.0
    status = JobStatus.FAILED if age > limits.create_grace_s else JobStatus.PENDING
    message = failures[-1].get("message") or ""
    return StatusReport(status, k8s_status.REASON_FAILED_CREATE, message)


def _user_error(pod: dict[str, Any]) -> bool:
    """The host exited ``USER_ERROR_EXIT``: the JobSet's rule fails the gang, no restart."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            if (state.get("terminated") or {}).get("exitCode") == USER_ERROR_EXIT:
                return True
    return False


def _int(value: Any) -> int:
    return int(value) if str(value or "").isdigit() else 0


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def _true(obj: dict[str, Any], kind: str) -> bool:
    return (_condition(obj, kind) or {}).get("status") == "True"
