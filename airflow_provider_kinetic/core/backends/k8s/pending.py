"""Why a GKE job still waits: the scheduler's and the cluster autoscaler's word on its
pod, and the state of the flex-start ProvisioningRequest behind its queue.

``k8s/status.py`` says a pod is ``Unschedulable`` (its ``PodScheduled`` condition);
``k8s/queues.py`` says where a suspended Job waits in its Kueue queue.  This module adds
what explains the wait further, folded into the same one line:

* the pod's events: the scheduler's latest ``FailedScheduling`` (when the condition
  says nothing) and the cluster autoscaler's latest word, ``TriggeredScaleUp`` (a node
  is on its way) or ``NotTriggerScaleUp`` (none will come, and why);
* for a job behind a Kueue queue whose ClusterQueue provisions through GKE's
  flex-start with queued provisioning (Dynamic Workload Scheduler), the state of its
  ProvisioningRequest (``autoscaling.x-k8s.io/v1``): its conditions.

Each is read at most once per ``queues.REFRESH_S`` per (namespace) per backend
(:class:`Seen`): one list of the namespace's events, one of its ProvisioningRequests,
whatever the number of jobs waiting there (the triggerer's shared reader answers all
its jobs from one backend).  A list refused (RBAC 403, a cluster without the CRD 404)
leaves the line as it was, and is not asked again before the refresh.  Plans only.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from dataclasses import replace
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.api import Call, Plan
from airflow_provider_kinetic.core.backends.k8s.capacity import NO_SCALE_UP, SCALE_UP
from airflow_provider_kinetic.core.backends.k8s.queues import Answers
from airflow_provider_kinetic.core.backends.k8s.status import (
    REASON_NOT_ADMITTED,
    REASON_UNSCHEDULABLE,
    parse_time,
)
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport

# -- events on a pending pod ------------------------------------------------------------
# The cluster autoscaler's Kubernetes events on a pod ("What events are emitted by CA?",
# https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md#what-events-are-emitted-by-ca):
#   TriggeredScaleUp  - "CA decided to scale up cluster to make place for this pod"
#   NotTriggerScaleUp - "CA couldn't find node group that can be scaled up to make this
#                        pod schedulable" (the message says why: "pod didn't trigger
#                        scale-up: 2 max node group size reached")
# GKE runs this autoscaler; its own page (https://cloud.google.com/kubernetes-engine/docs/
# how-to/cluster-autoscaler-visibility) documents the Cloud Logging visibility events
# (scaleUp, noScaleUp) and says they "are separate from the Kubernetes events produced
# by the cluster autoscaler", which are the ones read here.
# FailedScheduling: the scheduler's event on a pod no node fits (its message is the
# PodScheduled condition's).
FAILED_SCHEDULING = "FailedScheduling"
#: reason -> how the line names it
AUTOSCALER_SAYS = {SCALE_UP: "scale-up triggered", NO_SCALE_UP: "no scale-up"}

# -- ProvisioningRequest (flex-start with queued provisioning) ----------------------------
# https://docs.cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest
#   (flex-start with queued provisioning is "Dynamic Workload Scheduler combined with the
#   Provisioning Request custom resource definition"; Kueue "automatically handles the
#   Provisioning Request lifecycle" of a queued Job)
# The conditions, from the API itself (kubernetes/autoscaler, cluster-autoscaler/apis/
# provisioningrequest/autoscaling.x-k8s.io/v1/types.go):
#   Accepted        - "accepted by ClusterAutoscaler, so ClusterAutoscaler will attempt
#                      to provision the nodes for it"
#   Provisioned     - "all of the requested resources were created and registered in
#                      the cluster"
#   Failed          - "it is impossible to obtain resources to fulfill this
#                      ProvisioningRequest" (reason and message say what failed)
#   BookingExpired  - "had Provisioned condition before and capacity reservation time
#                      is expired"
#   CapacityRevoked - "requested resources are not longer valid"
# Kueue names the request after its Workload ("{workload}-{check}-{attempt}",
# kueue pkg/controller/admissionchecks/provisioning) and owns it by that Workload,
# whose name is "{kind}-{owner name}-{5 hex}" (kueue pkg/controller/jobframework
# GetWorkloadNameForOwnerWithGVK); an admitted pod names its request in the
# annotation below (cluster-autoscaler's ProvisioningRequestPodAnnotationKey).
PROVREQ_PATH = "/apis/autoscaling.x-k8s.io/v1/namespaces/{namespace}/provisioningrequests"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
#: condition type (True) -> what the line says, most telling first
PROVREQ_STATES = (
    ("Failed", "failed"),
    ("CapacityRevoked", "capacity revoked"),
    ("BookingExpired", "booking expired"),
    ("Provisioned", "provisioned, nodes starting"),
    ("Accepted", "accepted, waiting for capacity"),
)


def provreq_call(namespace: str) -> Call:
    """The list of ``namespace``'s ProvisioningRequests."""
    return Call(
        "CustomObjectsApi",
        "list_namespaced_custom_object",
        ("autoscaling.x-k8s.io", "v1", namespace, "provisioningrequests"),
    )


def provreq_state(request: dict[str, Any]) -> str:
    """A ProvisioningRequest's state in words: ``flex-start request NAME: failed
    (Reason: message)``, from its first true condition in :data:`PROVREQ_STATES`."""
    name = (request.get("metadata") or {}).get("name", "?")
    conditions = {
        c.get("type"): c
        for c in (request.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    }
    for kind, words in PROVREQ_STATES:
        cond = conditions.get(kind)
        if cond is not None and cond.get("status") == "True":
            detail = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
            if kind in ("Provisioned", "Accepted") or not detail:  # their words are ours
                return f"flex-start request {name}: {words}"
            return f"flex-start request {name}: {words} ({detail})"
    return f"flex-start request {name}: created, not accepted yet"


def request_of(
    requests: Iterable[dict[str, Any]], kind: str, name: str, pods: Iterable[dict[str, Any]]
) -> dict[str, Any] | None:
    """The ProvisioningRequest of object ``name`` (of ``kind``: ``Job``, ``JobSet``, ...):
    the one its pod consumes, else the newest one Kueue made for its Workload."""
    requests = [r for r in requests if isinstance(r, dict)]
    by_name = {(r.get("metadata") or {}).get("name"): r for r in requests}
    for pod in pods:
        wanted = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONSUME_ANNOTATION)
        if wanted in by_name:
            return by_name[wanted]
    workload = re.compile(re.escape(f"{kind.lower()}-{name}-") + "[0-9a-f]{5}")
    mine = [
        r
        for r in requests
        if any(
            o.get("kind") == "Workload" and workload.fullmatch(str(o.get("name") or ""))
            for o in (r.get("metadata") or {}).get("ownerReferences") or []
            if isinstance(o, dict)
        )
    ]
    if not mine:
        return None
    return max(mine, key=lambda r: (r.get("metadata") or {}).get("creationTimestamp") or "")


def scheduling_note(events: Iterable[dict[str, Any]], pod: str) -> tuple[str | None, str | None]:
    """(the scheduler's latest ``FailedScheduling`` message, the autoscaler's latest
    word) on pod ``pod``; ``None`` where it said nothing."""
    mine = [e for e in events if _about(e) == pod]
    failed = [e for e in mine if e.get("reason") == FAILED_SCHEDULING]
    scaler = [e for e in mine if e.get("reason") in AUTOSCALER_SAYS]
    said = None
    if scaler:
        latest = _latest(scaler)
        said = AUTOSCALER_SAYS[latest["reason"]]
        if latest.get("message"):
            said += f" ({latest['message']})"
    return (_latest(failed).get("message") if failed else None), said


def fold(
    report: StatusReport,
    pod: dict[str, Any] | None,
    events: Iterable[dict[str, Any]] | None,
    request: dict[str, Any] | None,
) -> StatusReport:
    """The waiting ``report`` with what explains its wait in the same one line:
    ``<its message>; cluster autoscaler: <word>; <request's state>``."""
    if report.status is not JobStatus.PENDING:
        return report
    message = report.message
    if pod is not None and events is not None and report.reason == REASON_UNSCHEDULABLE:
        failed, said = scheduling_note(events, _name(pod))
        if failed and (not message or message.startswith("no node fits the pod")):
            message = failed
        if said:
            message += f"; cluster autoscaler: {said}"
    if request is not None and report.reason in (REASON_NOT_ADMITTED, REASON_UNSCHEDULABLE):
        message += f"; {provreq_state(request)}"
    return report if message == report.message else replace(report, message=message)


class Seen(Answers[list[dict[str, Any]]]):
    """The last events and ProvisioningRequests per namespace, read again after
    ``refresh_s``."""

    def events(self, namespace: str) -> Plan[list[dict[str, Any]]]:
        """The namespace's scheduling and autoscaler events (the last list while fresh)."""
        key = ("events", namespace)
        if (found := self.fresh(key)) is not None:
            return found
        reply = yield Call("CoreV1Api", "list_namespaced_event", (namespace,), {})
        wanted = {FAILED_SCHEDULING, *AUTOSCALER_SAYS}
        return self.keep(key, [e for e in _items(reply) if e.get("reason") in wanted])

    def requests(self, namespace: str) -> Plan[list[dict[str, Any]]]:
        """The namespace's ProvisioningRequests (the last list while fresh; none where
        the CRD is missing or the list is refused)."""
        key = ("provreq", namespace)
        if (found := self.fresh(key)) is not None:
            return found
        return self.keep(key, _items((yield provreq_call(namespace))))


#: One :class:`Seen` per cluster and credentials in this process (:func:`shared`).
_SHARED: dict[Hashable, Seen] = {}


def shared(key: Hashable) -> Seen:
    """The process's :class:`Seen` for ``key`` (a cluster and the credentials that read
    it): the backends made per request (the Kinetic pages read a job's status at each
    poll, each with a backend of its own) then share one read per namespace a minute."""
    return _SHARED.setdefault(key, Seen())


def _items(reply: Any) -> list[dict[str, Any]]:
    if not reply.ok:
        return []
    try:
        body = reply.json() or {}
    except ValueError:  # not JSON: a proxy's page
        return []
    return [i for i in body.get("items") or [] if isinstance(i, dict)]


def _about(event: dict[str, Any]) -> str | None:
    return (event.get("involvedObject") or event.get("regarding") or {}).get("name")


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _latest(events: list[dict[str, Any]]) -> dict[str, Any]:
    def when(e: dict[str, Any]) -> str:
        for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
            t = parse_time(e.get(key))
            if t is not None:
                return t.isoformat()
        return ""

    return max(events, key=when)
