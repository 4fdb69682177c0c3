"""How a cluster backend reads job status: one job on its own, or many from one list.

Written once over three hooks a kind of object provides (``_owner_plan`` /
``_owners_plan``: read or list the job's object; ``_report``: THE diagnosis from
the object, its pods and events, via ``k8s/status.py`` and ``k8s/capacity.py``;
``_events_target``: whose events could explain a wait), so a Job
(:class:`~airflow_provider_kinetic.core.backends.k8s.gke.GkeBackend`), a
LeaderWorkerSet (``pathways.py``) and a JobSet (``jobset.py``) share the single read,
the batch read (by the group label) and the triggerer's shared read
(``shared_reads.py``: every kinetic job of a namespace by ``job-id``).  Plans only:
no client, no I/O (``k8s/api.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.backends.k8s import capacity as k8s_capacity
from airflow_provider_kinetic.core.backends.k8s import pending as k8s_pending
from airflow_provider_kinetic.core.backends.k8s import queues as k8s_queues
from airflow_provider_kinetic.core.backends.k8s import status as k8s_status
from airflow_provider_kinetic.core.backends.k8s.api import (
    Call,
    KubernetesApiError,
    Plan,
    items,
    json_or_none,
)
from airflow_provider_kinetic.core.backends.k8s.manifests import GROUP_LABEL
from airflow_provider_kinetic.core.catalog.capacity_gke import QUEUE_LABEL
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.spec.pod import label_value


@dataclass(frozen=True)
class Listed:
    """One job's answer from a listed read (``GkeBackend._listed_plan``).

    ``log_pod``: the pod its log is read from (``None``: no pod yet), known only when
    the job was in the list (``listed``); ``error``: its own read failed (then
    ``report`` is ``None``)."""

    report: StatusReport | None
    log_pod: dict[str, Any] | None = None
    listed: bool = False
    error: Exception | None = None


class StatusReads:
    """The status plans of a cluster backend (mixed into ``GkeBackend``); needs
    ``where(handle)`` and ``limits`` from it."""

    limits: k8s_status.Limits
    where: Any  # (handle) -> (namespace, object name), the backend's
    owned_kind: str  # the kind of the job's object (Kueue names its Workload after it)

    def _status_plan(self, handle: JobHandle) -> Plan[StatusReport]:
        """One job on its own: its object, its pods, and events only where they can
        explain a wait (``_events_target``)."""
        ns, name = self.where(handle)
        owner = yield from self._owner_plan(ns, name)
        if owner is None:
            return self._report(handle, None, [])
        pods = yield from self._pods_plan(ns, name)
        now = datetime.now(UTC)
        report = self._report(handle, owner, pods, now=now)
        target = self._events_target(handle, owner, pods, report, now)
        if target is None:
            return (yield from self._why_plan(ns, owner, pods, report))
        events = yield from self._events_plan(ns, target)
        report = self._report(handle, owner, pods, events, now=now)
        return (yield from self._why_plan(ns, owner, pods, report, events))

    def _why_plan(
        self,
        ns: str,
        owner: dict[str, Any],
        pods: list[dict[str, Any]],
        report: StatusReport,
        events: list[dict[str, Any]] | None = None,
    ) -> Plan[StatusReport]:
        """Why a job still waits, in its one line: its place in its Kueue queue
        (``k8s/queues.py``), its pod's scheduling and autoscaler events, and its
        flex-start ProvisioningRequest's state (``k8s/pending.py``); each read at most
        once a minute per queue or namespace per backend."""
        if report.status is not JobStatus.PENDING:
            return report
        queue = _labels(owner).get(QUEUE_LABEL)
        name = owner["metadata"]["name"]
        if report.reason == k8s_status.REASON_NOT_ADMITTED and queue:
            positions = self.__dict__.get("_queue_positions")
            if positions is None:
                positions = self.__dict__["_queue_positions"] = k8s_queues.QueuePositions()
            found = yield from positions.plan(ns, queue)
            report = k8s_queues.fold(report, found.get(name))
        waiting = (k8s_status.REASON_NOT_ADMITTED, k8s_status.REASON_UNSCHEDULABLE)
        if report.reason not in waiting:
            return report
        seen = self.__dict__.get("_why_seen")
        if seen is None:
            seen = self.__dict__["_why_seen"] = k8s_pending.Seen()
        pod = k8s_status.select_pod(pods)
        if report.reason == k8s_status.REASON_UNSCHEDULABLE and events is None:
            events = yield from seen.events(ns)
        request = None
        if queue:  # Kueue makes the ProvisioningRequest of a queued-provisioning queue
            requests = yield from seen.requests(ns)
            request = k8s_pending.request_of(requests, self.owned_kind, name, pods)
        return k8s_pending.fold(report, pod, events, request)

    # The three hooks a kind of object overrides (pathways.py: LeaderWorkerSets); the
    # single read above and the listed reads below are written once, on them.
    def _owner_plan(self, ns: str, name: str) -> Plan[dict[str, Any] | None]:
        """The job's object (``None``: the API said 404)."""
        reply = yield Call("BatchV1Api", "read_namespaced_job", (name, ns))
        return json_or_none(reply, f"reading Job {name}")

    def _owners_plan(self, ns: str, selector: str) -> Plan[dict[str, dict[str, Any]]]:
        """The jobs' objects in ``ns`` that carry ``selector``, by name."""
        reply = yield Call("BatchV1Api", "list_namespaced_job", (ns,), {"label_selector": selector})
        return {j["metadata"]["name"]: j for j in items(reply, f"listing Jobs ({selector})")}

    def _report(
        self,
        handle: JobHandle,
        owner: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        events: list[dict[str, Any]] | tuple[()] = (),
        *,
        now: datetime | None = None,
    ) -> StatusReport:
        """THE diagnosis of one job from what the API returned (``k8s/status.py``), with
        the capacity step's verdict (``k8s/capacity.py``)."""
        if owner is None:
            return k8s_status.job_status(None, [])
        now = now or datetime.now(UTC)
        report = k8s_status.job_status(owner, pods, events, now=now, limits=self.limits)
        return k8s_capacity.capacity_verdict(
            report, owner, pods, now, handle.capacity_wait_s, self.limits, events
        )

    def _events_target(
        self,
        handle: JobHandle,
        owner: dict[str, Any],
        pods: list[dict[str, Any]],
        report: StatusReport,
        now: datetime,
    ) -> str | None:
        """The object whose events could explain a wait (``None``: no read needed).

        Events cost a call, so they are read only where they can explain a wait: a
        Job without pods (FailedCreate), a pod stuck starting (FailedMount), or a
        capacity step whose wait is over (a scale-up on its way)."""
        due = k8s_capacity.capacity_due(report, owner, pods, now, handle.capacity_wait_s)
        pending = report.status is JobStatus.PENDING
        pod = k8s_status.select_pod(pods)
        if not due and not (
            pending and (pod is None or k8s_status.needs_pod_events(pod, now, self.limits))
        ):
            return None
        return owner["metadata"]["name"] if pod is None else pod["metadata"]["name"]

    def _log_pod_of(self, name: str, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Of a job's pods, the one whose log is the job's log (kinetic: the status pick)."""
        return k8s_status.select_pod(pods)

    def _batch_plan(self, group_id: str, handles: list[JobHandle]) -> Plan[dict[str, StatusReport]]:
        """Two list calls per namespace for a whole batch (jobs and pods by GROUP_LABEL),
        plus one list of the namespace's events when some child's wait needs them."""
        by_ns: dict[str, list[JobHandle]] = {}
        for handle in handles:
            by_ns.setdefault(self.where(handle)[0], []).append(handle)
        selector = f"{GROUP_LABEL}={label_value(group_id)}"
        result: dict[str, StatusReport] = {}
        for ns, group in by_ns.items():
            found = yield from self._listed_plan(ns, selector, group)
            result.update({job_id: seen.report for job_id, seen in found.items()})
        return result

    def _listed_plan(
        self, ns: str, selector: str, handles: list[JobHandle], *, isolate: bool = False
    ) -> Plan[dict[str, Listed]]:
        """The status of every job in ``handles`` (all in ``ns``) from one list of their
        objects and one of their pods by ``selector``, plus one list of the namespace's
        events when some job's wait needs them.

        A job missing from the list (deleted, or submitted without the label) gets the
        single-job read: slower, never wrong, and never NOT_FOUND without it.  With
        ``isolate`` such a read's failure is that job's alone (``Listed.error``).
        """
        owners = yield from self._owners_plan(ns, selector)
        reply = yield Call("CoreV1Api", "list_namespaced_pod", (ns,), {"label_selector": selector})
        pods: dict[str, list[dict[str, Any]]] = {}  # by job: one pass, not one per job
        for pod in items(reply, f"listing pods ({selector})"):
            pods.setdefault(_labels(pod).get("job-name", ""), []).append(pod)
        now = datetime.now(UTC)
        result: dict[str, Listed] = {}
        waiting = []
        for handle in handles:
            name = self.where(handle)[1]
            if name not in owners:
                try:
                    result[handle.job_id] = Listed((yield from self._status_plan(handle)))
                except KubernetesApiError as exc:
                    if not isolate:
                        raise
                    result[handle.job_id] = Listed(None, error=exc)
                continue
            mine = pods.get(name, [])
            report = self._report(handle, owners[name], mine, now=now)
            target = self._events_target(handle, owners[name], mine, report, now)
            if target is None:
                report = yield from self._why_plan(ns, owners[name], mine, report)
                result[handle.job_id] = Listed(report, self._log_pod_of(name, mine), True)
            else:
                waiting.append((handle, name, mine, target))
        if waiting:
            reply = yield Call("CoreV1Api", "list_namespaced_event", (ns,), {})
            events = items(reply, f"listing events in {ns}") if reply.status != 403 else []
            for handle, name, mine, target in waiting:
                names = {name, target} | {p["metadata"]["name"] for p in mine}
                own = [e for e in events if (e.get("involvedObject") or {}).get("name") in names]
                report = self._report(handle, owners[name], mine, own, now=now)
                report = yield from self._why_plan(ns, owners[name], mine, report, own)
                result[handle.job_id] = Listed(report, self._log_pod_of(name, mine), True)
        return result

    def _pods_plan(self, ns: str, name: str) -> Plan[list[dict[str, Any]]]:
        call = Call(
            "CoreV1Api", "list_namespaced_pod", (ns,), {"label_selector": f"job-name={name}"}
        )
        return items((yield call), f"listing pods of {name}")

    def _events_plan(self, ns: str, name: str) -> Plan[list[dict[str, Any]]]:
        selector = {"field_selector": f"involvedObject.name={name}"}
        reply = yield Call("CoreV1Api", "list_namespaced_event", (ns,), selector)
        return items(reply, f"listing events of {name}") if reply.status != 403 else []


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}
