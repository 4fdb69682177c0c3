"""Diagnose a Job or LeaderWorkerSet from the objects the API server returns.

Pure functions over camelCase dicts (the JSON the API sends, i.e. what
``ApiClient().sanitize_for_serialization(obj)`` gives), so the sync backend, the
async trigger path and the tests share one set of rules.

kinetic's ``status()`` only follows Job counters and pod phases (protocol notes
§2.15), so a job with a bad image or an impossible accelerator request stays
PENDING forever.  Here every way a pod can be stuck or killed gets its own
``reason`` constant, and the stuck ones turn FAILED once they have lasted longer
than a grace period: image pulls and mounts can recover (a late push, a fixed IAM
binding) and node pools scale up from zero, so failing on first sight would kill
healthy jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.catalog.capacity_gke import QUEUE_LABEL
from airflow_provider_kinetic.core.spec.handles import (
    REASON_EVICTED,
    REASON_PREEMPTED,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.spec.pod import CONTAINER_NAME

# -- reasons (StatusReport.reason); values are stable strings, shown in task logs --
REASON_NOT_FOUND = "NotFound"
REASON_ERR_IMAGE_PULL = "ErrImagePull"
REASON_IMAGE_PULL_BACKOFF = "ImagePullBackOff"
REASON_INVALID_IMAGE_NAME = "InvalidImageName"
REASON_ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
REASON_CONTAINER_CONFIG = "CreateContainerConfigError"
REASON_FAILED_MOUNT = "FailedMount"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_FAILED_CREATE = "FailedCreate"
REASON_OOM_KILLED = "OOMKilled"
REASON_NONZERO_EXIT = "NonZeroExit"
REASON_POD_FAILED = "PodFailed"
REASON_WORKER_FAILED = "WorkerFailed"
#: The node controller lost the pod's node (unreachable, deleted): infra, not a preemption.
REASON_NODE_LOST = "NodeLost"
REASON_JOB_FAILED = "JobFailed"
#: A Kueue-queued Job not admitted yet (still suspended): waiting, not a failure.
REASON_NOT_ADMITTED = "NotAdmitted"

#: kubelet waiting reasons of an image that cannot be pulled, mapped to our reasons.
IMAGE_PULL_REASONS = {
    "ErrImagePull": REASON_ERR_IMAGE_PULL,
    "ImagePullBackOff": REASON_IMAGE_PULL_BACKOFF,
    "InvalidImageName": REASON_INVALID_IMAGE_NAME,
    "ErrImageNeverPull": REASON_ERR_IMAGE_NEVER_PULL,
}
_CONFIG_ERRORS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
# Pod status reasons the kubelet / node lifecycle set when a node goes away.
_NODE_GONE = frozenset({"Terminated", "NodeShutdown", "Shutdown", "Preempting"})
_SPOT_LABEL = "cloud.google.com/gke-spot"


@dataclass(frozen=True)
class Limits:
    """How long a stuck state may last before the job counts as FAILED.

    ``schedule_timeout_s`` is generous because TPU/GPU node pools scale up from
    zero (minutes) and capacity may appear later; ``None`` waits forever.
    """

    image_pull_grace_s: float = 300.0
    schedule_timeout_s: float | None = 1800.0
    create_grace_s: float = 180.0


def job_status(
    job: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    events: Iterable[dict[str, Any]] = (),
    *,
    now: datetime | None = None,
    limits: Limits = Limits(),
) -> StatusReport:
    """Status of a batch/v1 Job (``None`` = the API said 404) from its pods and events."""
    if job is None:
        return StatusReport(JobStatus.NOT_FOUND, REASON_NOT_FOUND, "the Job does not exist")
    now = now or datetime.now(UTC)
    events = list(events)
    status = job.get("status") or {}
    if (status.get("succeeded") or 0) >= 1 or _condition_true(job, "Complete"):
        return StatusReport(JobStatus.SUCCEEDED)
    if (status.get("failed") or 0) >= 1 or _condition_true(job, "Failed"):
        for pod in pods:  # the pod says why; the Job only says "BackoffLimitExceeded"
            report = pod_failure(pod)
            if report:
                return report
        cond = _condition(job, "Failed") or {}
        detail = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
        return StatusReport(JobStatus.FAILED, REASON_JOB_FAILED, detail or "the Job failed")
    pod = select_pod(pods)
    if pod is None and (job.get("spec") or {}).get("suspend"):
        queue = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
        where = f"in queue {queue}" if queue else "(the Job is suspended)"
        return StatusReport(
            JobStatus.PENDING, REASON_NOT_ADMITTED, f"waiting for admission {where}"
        )
    if pod is None:
        return _not_created(job, events, now, limits)
    report = pod_failure(pod)  # the Job controller has not counted it yet
    if report:
        return report
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Running", "Succeeded"):
        return StatusReport(JobStatus.RUNNING)
    return pod_pending(pod, now, limits, events) or _pending(pod)


def pathways_status(
    lws: dict[str, Any] | None,
    pods: Sequence[dict[str, Any]],
    events: Iterable[dict[str, Any]] = (),
    *,
    leader_name: str,
    now: datetime | None = None,
    limits: Limits = Limits(),
) -> StatusReport:
    """Status of a LeaderWorkerSet group from its leader pod ``leader_name`` and workers.

    LWS pods restart (restartPolicy Always), so a finished container shows up as
    ``lastState.terminated``; any failed worker fails the job because the JAX
    program cannot finish without every host.
    """
    if lws is None:
        return StatusReport(
            JobStatus.NOT_FOUND, REASON_NOT_FOUND, "the LeaderWorkerSet does not exist"
        )
    now = now or datetime.now(UTC)
    events = list(events)
    leader = next((p for p in pods if _name(p) == leader_name), None)
    workers = [p for p in pods if p is not leader]
    if leader is not None:
        report = pod_failure(leader)
        if report:
            return report
    for worker in workers:
        report = pod_failure(worker)
        if report:
            reason = report.reason if report.reason != REASON_NONZERO_EXIT else REASON_WORKER_FAILED
            return StatusReport(
                JobStatus.FAILED, reason, f"worker pod {_name(worker)}: {report.message}"
            )
    if leader is None:
        return _not_created(lws, events, now, limits)
    if _leader_done(leader):
        return StatusReport(JobStatus.SUCCEEDED)
    stuck = [r for r in (pod_pending(p, now, limits, events) for p in [leader, *workers]) if r]
    failed = [r for r in stuck if r.status is JobStatus.FAILED]
    if failed:
        return failed[0]
    if (leader.get("status") or {}).get("phase") == "Running":
        if stuck:  # the leader waits for a worker that cannot start
            return StatusReport(JobStatus.RUNNING, stuck[0].reason, stuck[0].message)
        return StatusReport(JobStatus.RUNNING)
    return stuck[0] if stuck else _pending(leader)


def select_pod(pods: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """kinetic's pick: the first Running pod, else the first Pending, else the first."""
    for phase in ("Running", "Pending"):
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == phase:
                return pod
    return pods[0] if pods else None


def pod_failure(pod: dict[str, Any]) -> StatusReport | None:
    """Why ``pod`` failed (a FAILED report), or ``None`` when it has not failed."""
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":  # a later disruption of its node changes nothing
        return None
    terminated = _terminations(pod)
    for name, term in terminated:
        if term.get("reason") == "OOMKilled":
            return StatusReport(
                JobStatus.FAILED,
                REASON_OOM_KILLED,
                f"container {name} ran out of memory (exit code {term.get('exitCode')}); "
                "ask for a larger machine or reduce memory use",
            )
    # Pod reason "Evicted": kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/;
    # DisruptionTarget and its reasons (EvictionByEvictionAPI, PreemptionByScheduler, ...):
    # "Pod disruption conditions", kubernetes.io/docs/concepts/workloads/pods/disruptions/;
    # "NodeLost": a pod status reason as kube-state-metrics' kube_pod_status_reason lists.
    disruption = _condition(pod, "DisruptionTarget")
    disrupted = disruption is not None and disruption.get("status") == "True"
    d_reason = (disruption or {}).get("reason", "")
    message = status.get("message") or (disruption or {}).get("message") or ""
    if status.get("reason") == "Evicted" or (disrupted and d_reason == "EvictionByEvictionAPI"):
        return StatusReport(JobStatus.FAILED, REASON_EVICTED, message or "the pod was evicted")
    if status.get("reason") == REASON_NODE_LOST and not disrupted:
        what = message or "the node the pod ran on was lost"
        return StatusReport(JobStatus.FAILED, REASON_NODE_LOST, what)
    if disrupted or status.get("reason") in _NODE_GONE:
        spot = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(_SPOT_LABEL) == "true"
        what = "the spot VM was reclaimed" if spot else "the node went away"
        detail = ", ".join(x for x in (d_reason or status.get("reason"), message) if x)
        return StatusReport(JobStatus.FAILED, REASON_PREEMPTED, f"{what} ({detail})")
    for name, term in terminated:
        code = term.get("exitCode")
        if code not in (None, 0):
            text = f"container {name} exited with code {code}"
            if term.get("reason") and term["reason"] != "Error":
                text += f" ({term['reason']})"
            return StatusReport(JobStatus.FAILED, REASON_NONZERO_EXIT, text)
    if status.get("phase") == "Failed":
        detail = ": ".join(x for x in (status.get("reason"), message) if x)
        return StatusReport(JobStatus.FAILED, REASON_POD_FAILED, detail or "the pod failed")
    return None


def pod_pending(
    pod: dict[str, Any],
    now: datetime,
    limits: Limits,
    events: Iterable[dict[str, Any]] = (),
) -> StatusReport | None:
    """A reason a not-yet-running pod is stuck: PENDING while in grace, FAILED after."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("reason") == "SchedulingGated":
        # Kueue gates the pods of a queued LeaderWorkerSet until it is admitted.
        return StatusReport(JobStatus.PENDING, REASON_NOT_ADMITTED, "waiting for admission")
    if scheduled is not None and scheduled.get("status") == "False":
        message = _schedule_hint(scheduled.get("message") or "no node fits the pod")
        age = _age(pod, now, None)
        timeout = limits.schedule_timeout_s
        status = JobStatus.FAILED if timeout is not None and age > timeout else JobStatus.PENDING
        return StatusReport(status, REASON_UNSCHEDULABLE, message)
    started_age = _age(pod, now, (pod.get("status") or {}).get("startTime"))
    late = started_age > limits.image_pull_grace_s
    for name, waiting in _waiting(pod):
        raw = waiting.get("reason") or ""
        reason = IMAGE_PULL_REASONS.get(raw) or (
            REASON_CONTAINER_CONFIG if raw in _CONFIG_ERRORS else None
        )
        if reason:
            message = f"container {name}: {waiting.get('message') or raw}"
            return StatusReport(JobStatus.FAILED if late else JobStatus.PENDING, reason, message)
    if late and any(w.get("reason") in _STARTING for _, w in _waiting(pod)):
        mounts = [e for e in events if e.get("reason") == "FailedMount" and _about(e, _name(pod))]
        if mounts:
            message = _latest(mounts).get("message") or "a volume cannot be mounted"
            return StatusReport(JobStatus.FAILED, REASON_FAILED_MOUNT, message)
    return None


def needs_pod_events(pod: dict[str, Any] | None, now: datetime, limits: Limits) -> bool:
    """Whether a pod has been starting so long that its events (FailedMount) are worth a read."""
    if pod is None or (pod.get("status") or {}).get("phase") != "Pending":
        return False
    late = _age(pod, now, (pod.get("status") or {}).get("startTime")) > limits.image_pull_grace_s
    return late and any(w.get("reason") in _STARTING for _, w in _waiting(pod))


def parse_time(value: str | None) -> datetime | None:
    """An API timestamp (RFC 3339, ``Z`` suffix, maybe fractional) as an aware datetime."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# ---- helpers -------------------------------------------------------------------------


def _not_created(
    owner: dict[str, Any], events: list[dict[str, Any]], now: datetime, limits: Limits
) -> StatusReport:
    """No pod yet: a FailedCreate event on the owner (Job, or the LWS's StatefulSet) says why."""
    failures = [e for e in events if e.get("reason") == "FailedCreate" and _about(e, _name(owner))]
    if not failures:
        return StatusReport(JobStatus.PENDING, None, "waiting for the pod to be created")
    first = min((t for t in (_event_time(e, first=True) for e in failures) if t), default=None)
    age = _age(owner, now, None if _created(owner) else _iso(first))
    status = JobStatus.FAILED if age > limits.create_grace_s else JobStatus.PENDING
    return StatusReport(status, REASON_FAILED_CREATE, _latest(failures).get("message") or "")


def _pending(pod: dict[str, Any]) -> StatusReport:
    waiting = [w.get("reason") for _, w in _waiting(pod) if w.get("reason")]
    return StatusReport(JobStatus.PENDING, None, waiting[0] if waiting else "")


def _leader_done(leader: dict[str, Any]) -> bool:
    """Finished: the runner idles after success with the pod Ready (see
    ``manifests.lws_manifest``); older images exit 0."""
    if (leader.get("status") or {}).get("phase") == "Succeeded":
        return True
    ready = _condition(leader, "Ready")
    if ready is not None and ready.get("status") == "True":
        return True
    return any(t.get("exitCode") == 0 for _, t in _terminations(leader))


def _schedule_hint(message: str) -> str:
    if "Insufficient google.com/tpu" in message or "Insufficient nvidia.com/gpu" in message:
        return (
            message + " (no node with free accelerators: check the node pool, its size and quota)"
        )
    if "node affinity/selector" in message:
        return message + " (no node pool matches the accelerator's node selector)"
    return message


def _terminations(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, terminated state) of the kinetic container, current state then last state.

    Only the payload's container counts: a restarted sidecar (gcsfuse) is not the
    job's outcome, and if it breaks the payload, the payload's own exit says so.
    """
    result = []
    for cs in _container_statuses(pod):
        if cs.get("name") != CONTAINER_NAME:
            continue
        for key in ("state", "lastState"):
            term = (cs.get(key) or {}).get("terminated")
            if term:
                result.append((cs.get("name", ""), term))
    return result


def _waiting(pod: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (cs.get("name", ""), cs["state"]["waiting"])
        for cs in _container_statuses(pod)
        if (cs.get("state") or {}).get("waiting")
    ]


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    statuses = list(status.get("containerStatuses") or [])
    statuses += status.get("initContainerStatuses") or []  # e.g. the gcsfuse sidecar
    return sorted(statuses, key=lambda cs: cs.get("name") != CONTAINER_NAME)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    return (_condition(obj, kind) or {}).get("status") == "True"


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _created(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("creationTimestamp")


def _age(obj: dict[str, Any], now: datetime, since: str | None) -> float:
    """Seconds since ``since`` (else the object's creation); 0 when the API gave no time."""
    start = parse_time(since) or parse_time(_created(obj))
    return (now - start).total_seconds() if start else 0.0


def _about(event: dict[str, Any], name: str) -> bool:
    return (event.get("involvedObject") or event.get("regarding") or {}).get("name") == name


def _event_time(event: dict[str, Any], first: bool = False) -> datetime | None:
    keys = (
        ("firstTimestamp", "eventTime", "lastTimestamp")
        if first
        else ("lastTimestamp", "eventTime", "firstTimestamp")
    )
    for key in keys:
        parsed = parse_time(event.get(key))
        if parsed:
            return parsed
    return parse_time((event.get("metadata") or {}).get("creationTimestamp"))


def _latest(events: list[dict[str, Any]]) -> dict[str, Any]:
    epoch = datetime.min.replace(tzinfo=UTC)
    return max(events, key=lambda e: _event_time(e) or epoch)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
