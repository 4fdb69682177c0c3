"""The Pathways backend: a multi-host job as one LeaderWorkerSet group.

kinetic calls LWS + multi-process JAX "Pathways" (protocol notes §2.10): one pod
per TPU host, created together, recreated together.  Everything but the object
kind is the GKE backend's: the same pod spec, the same plans and drivers, the
same diagnosis (with the leader/worker rules of :func:`k8s_status.pathways_status`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.backends.k8s import capacity as k8s_capacity
from airflow_provider_kinetic.core.backends.k8s import status as k8s_status
from airflow_provider_kinetic.core.backends.k8s.api import Call, Plan, Reply, items, json_or_none
from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import (
    LWS_DEFAULT_VERSION,
    LWS_GROUP,
    LWS_PLURAL,
    leader_pod_name,
    lws_manifest,
    lws_name,
)
from airflow_provider_kinetic.core.backends.k8s.ownership import Ownership, delete_options
from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.spec.pod import CONTAINER_NAME, JobSpec


class PathwaysBackend(GkeBackend):
    """Runs each job as a LeaderWorkerSet ``keras-pathways-{job_id}`` (size = hosts).

    The LWS API version is discovered once per backend (the cluster's preferred
    version of the group), falling back to ``v1`` when discovery fails.
    LeaderWorkerSets never expire by themselves: ``cancel`` is the cleanup.
    """

    name = "pathways"
    console_kind = "leaderworkerset"
    owned_kind = "LeaderWorkerSet"

    @classmethod
    def preflight(cls, accelerator: Accelerator, requested: str | None = None) -> None:
        """Any accelerator: a single host is a group of one."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lws_version: str | None = None

    @classmethod
    def manifest(cls, spec: JobSpec) -> dict[str, Any]:
        """The LeaderWorkerSet at the default API version (``submit`` uses the discovered one)."""
        return lws_manifest(spec)

    @classmethod
    def object_name(cls, job_id: str) -> str:
        return lws_name(job_id)

    def _version_plan(self) -> Plan[str]:
        if self._lws_version is None:
            reply = yield Call("ApisApi", "get_api_versions")
            groups = ((reply.json() or {}).get("groups") or []) if reply.ok else []
            group = next((g for g in groups if g.get("name") == LWS_GROUP), None)
            if group is None:  # not discoverable (RBAC, old server): kinetic's default
                return LWS_DEFAULT_VERSION
            self._lws_version = (group.get("preferredVersion") or {}).get(
                "version"
            ) or LWS_DEFAULT_VERSION
        return self._lws_version

    def _custom(self, method: str, *args: Any, **kwargs: Any) -> Call:
        return Call("CustomObjectsApi", method, args, kwargs)

    def _submit_plan(self, spec: JobSpec) -> Plan[None]:
        version = yield from self._version_plan()
        body = self._stamped(lws_manifest(spec, f"{LWS_GROUP}/{version}"))
        create = self._custom(
            "create_namespaced_custom_object", LWS_GROUP, version, spec.namespace, LWS_PLURAL, body
        )
        yield from self._with_secrets(spec, create, self._ownership_of(self.owned_kind, body))

    def _owner_plan(self, ns: str, name: str) -> Plan[dict[str, Any] | None]:
        version = yield from self._version_plan()
        reply = yield self._custom(
            "get_namespaced_custom_object", LWS_GROUP, version, ns, LWS_PLURAL, name
        )
        return json_or_none(reply, f"reading LeaderWorkerSet {name}")

    def _owners_plan(self, ns: str, selector: str) -> Plan[dict[str, dict[str, Any]]]:
        version = yield from self._version_plan()
        reply = yield self._custom(
            "list_namespaced_custom_object",
            LWS_GROUP,
            version,
            ns,
            LWS_PLURAL,
            label_selector=selector,
        )
        found = items(reply, f"listing LeaderWorkerSets ({selector})")
        return {o["metadata"]["name"]: o for o in found}

    def _report(
        self,
        handle: JobHandle,
        owner: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        events: list[dict[str, Any]] | tuple[()] = (),
        *,
        now: datetime | None = None,
    ) -> StatusReport:
        """The leader/worker rules (:func:`k8s_status.pathways_status`) + the capacity verdict."""
        if owner is None:
            return k8s_status.pathways_status(None, [], leader_name="")
        now = now or datetime.now(UTC)
        leader = leader_pod_name(owner["metadata"]["name"])
        report = k8s_status.pathways_status(
            owner, pods, events, leader_name=leader, now=now, limits=self.limits
        )
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
        """Without a leader pod, the leader StatefulSet (named like the LWS) has the
        FailedCreate events; a leader stuck starting may have FailedMount events."""
        due = k8s_capacity.capacity_due(report, owner, pods, now, handle.capacity_wait_s)
        if report.status is not JobStatus.PENDING and not due:
            return None
        name = owner["metadata"]["name"]
        pod = self._log_pod_of(name, pods)
        if pod is None:
            return name
        if due or k8s_status.needs_pod_events(pod, now, self.limits):
            return pod["metadata"]["name"]
        return None

    def _log_pod_of(self, name: str, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The leader: it runs process 0, whose output is the job's."""
        leader = leader_pod_name(name)
        return next((p for p in pods if p["metadata"]["name"] == leader), None)

    def _batch_plan(self, group_id: str, handles: list[JobHandle]) -> Plan[dict[str, StatusReport]]:
        """One status per LeaderWorkerSet (multi-host batches are small)."""
        result: dict[str, StatusReport] = {}
        for handle in handles:
            result[handle.job_id] = yield from self._status_plan(handle)
        return result

    def read_host_log(self, handle: JobHandle, host: int, lines: int) -> str | None:
        """The last ``lines`` of worker ``host``'s log (its pod ``{lws}-0-{host}``): a
        failing worker's own output, shown beside the leader's."""
        return self._run(self._host_log_plan(handle, host, lines)) if host > 0 else None

    def _host_log_plan(self, handle: JobHandle, host: int, lines: int) -> Plan[str | None]:
        ns, name = self.where(handle)
        pod = f"{leader_pod_name(name)}-{host}"
        kwargs = {"container": CONTAINER_NAME, "tail_lines": lines}
        reply = yield Call("CoreV1Api", "read_namespaced_pod_log", (pod, ns), kwargs)
        return reply.body.decode("utf-8", "replace") if reply.ok else None

    def _log_pod_plan(self, ns: str, name: str) -> Plan[dict[str, Any] | None]:
        """The leader pod: it runs process 0, whose output is the job's (kinetic shows only it)."""
        reply = yield Call("CoreV1Api", "read_namespaced_pod", (leader_pod_name(name), ns))
        return json_or_none(reply, f"reading the leader pod of {name}")

    def _delete_plan(self, ownership: Ownership, uid: str | None) -> Plan[Reply]:
        """Delete the LeaderWorkerSet (foreground) if it still has ``uid``."""
        version = yield from self._version_plan()
        return (
            yield self._custom(
                "delete_namespaced_custom_object",
                LWS_GROUP,
                version,
                ownership.namespace,
                LWS_PLURAL,
                ownership.name,
                body=delete_options(uid),
                propagation_policy="Foreground",
            )
        )
