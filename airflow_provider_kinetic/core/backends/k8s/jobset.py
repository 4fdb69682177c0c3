"""The multi-slice backend: a job of several TPU slices as one JobSet.

``num_slices > 1`` (``core.catalog.multislice``) runs as a JobSet (``manifests.
jobset_manifest``): one Job per slice, the slice's hosts as its pods, the whole gang
restarted together.  Everything but the object kind is the GKE backend's: the same pod
spec, plans, drivers, log reads and ownership; the diagnosis is ``k8s/slices.py``
(which slice and host failed or waits).  ``auto`` picks this backend for more than
one slice (``registry.MULTI_SLICE``); a single multi-host slice stays on Pathways.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.backends.k8s import capacity as k8s_capacity
from airflow_provider_kinetic.core.backends.k8s import slices as k8s_slices
from airflow_provider_kinetic.core.backends.k8s import status as k8s_status
from airflow_provider_kinetic.core.backends.k8s.api import Call, Plan, Reply, items, json_or_none
from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import (
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    jobset_manifest,
    jobset_name,
)
from airflow_provider_kinetic.core.backends.k8s.ownership import Ownership, delete_options
from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.catalog.multislice import check_num_slices
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.spec.pod import CONTAINER_NAME, JobSpec


class JobSetBackend(GkeBackend):
    """Runs each job as a JobSet ``kinetic-slices-{job_id}`` (``jobset.x-k8s.io/v1alpha2``).

    Never an ``auto`` candidate by preflight: ``auto`` picks it by the slice count.
    JobSets expire ``ttlSecondsAfterFinished`` after they end; ``cancel`` deletes one.
    """

    name = "jobset"
    auto_candidate = False
    runs_slices = True
    #: The console has no page of a JobSet's own that we could confirm: Google's xpk,
    #: which runs multi-slice TPU training as JobSets, links a workload to the page of
    #: the headless Service JobSet makes under the JobSet's name ("Follow your workload
    #: here: .../kubernetes/service/{location}/{cluster}/default/{workload}/details",
    #: AI-Hypercomputer/xpk src/xpk/commands/workload.py), so the link does the same.
    console_kind = "service"
    owned_kind = "JobSet"

    @classmethod
    def preflight(cls, accelerator: Accelerator, requested: str | None = None) -> None:
        """Slices GKE can join: multi-host TPU slices of ``MULTISLICE_TPUS``."""
        try:
            check_num_slices(2, accelerator)
        except ValueError as exc:
            raise ValueError(f"the jobset backend runs multi-slice TPU jobs: {exc}") from None

    @classmethod
    def manifest(cls, spec: JobSpec) -> dict[str, Any]:
        return jobset_manifest(spec)

    @classmethod
    def object_name(cls, job_id: str) -> str:
        return jobset_name(job_id)

    def _custom(self, method: str, *args: Any, **kwargs: Any) -> Call:
        return Call("CustomObjectsApi", method, (JOBSET_GROUP, JOBSET_VERSION, *args), kwargs)

    def _submit_plan(self, spec: JobSpec) -> Plan[None]:
        body = self._stamped(jobset_manifest(spec))
        create = self._custom(
            "create_namespaced_custom_object", spec.namespace, JOBSET_PLURAL, body
        )
        yield from self._with_secrets(spec, create, self._ownership_of(self.owned_kind, body))

    def _owner_plan(self, ns: str, name: str) -> Plan[dict[str, Any] | None]:
        reply = yield self._custom("get_namespaced_custom_object", ns, JOBSET_PLURAL, name)
        return json_or_none(reply, f"reading JobSet {name}")

    def _owners_plan(self, ns: str, selector: str) -> Plan[dict[str, dict[str, Any]]]:
        reply = yield self._custom(
            "list_namespaced_custom_object", ns, JOBSET_PLURAL, label_selector=selector
        )
        found = items(reply, f"listing JobSets ({selector})")
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
        """The slice rules (:func:`k8s_slices.jobset_status`) + the capacity verdict."""
        if owner is None:
            return k8s_slices.jobset_status(None, [])
        now = now or datetime.now(UTC)
        report = k8s_slices.jobset_status(owner, pods, events, now=now, limits=self.limits)
        current = k8s_slices.current_pods(owner, pods)
        return k8s_capacity.capacity_verdict(
            report, owner, current, now, handle.capacity_wait_s, self.limits, events
        )

    def _events_target(
        self,
        handle: JobHandle,
        owner: dict[str, Any],
        pods: list[dict[str, Any]],
        report: StatusReport,
        now: datetime,
    ) -> str | None:
        """Without pods, slice 0's Job (its FailedCreate events: every slice's Job has the
        same pod template); else a pod stuck starting."""
        current = k8s_slices.current_pods(owner, pods)
        due = k8s_capacity.capacity_due(report, owner, current, now, handle.capacity_wait_s)
        if report.status is not JobStatus.PENDING and not due:
            return None
        if not current:
            return k8s_slices.first_slice_job(owner)
        stuck = next((p for p in current if k8s_status.needs_pod_events(p, now, self.limits)), None)
        if due or stuck is not None:
            return (stuck or current[0])["metadata"]["name"]
        return None

    def _log_pod_of(self, name: str, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Slice 0 host 0: it runs process 0, whose output is the job's."""
        return k8s_slices.leader_pod(pods)

    def _log_pod_plan(self, ns: str, name: str) -> Plan[dict[str, Any] | None]:
        return k8s_slices.leader_pod((yield from self._pods_plan(ns, name)))

    def _batch_plan(self, group_id: str, handles: list[JobHandle]) -> Plan[dict[str, StatusReport]]:
        """One status per JobSet (multi-slice batches are small)."""
        result: dict[str, StatusReport] = {}
        for handle in handles:
            result[handle.job_id] = yield from self._status_plan(handle)
        return result

    def read_host_log(self, handle: JobHandle, host: int, lines: int) -> str | None:
        """The last ``lines`` of the job's host ``host`` (slice ``host // hosts``): a
        failing host's own output, shown beside the leader's."""
        return self._run(self._host_log_plan(handle, host, lines)) if host > 0 else None

    def _host_log_plan(self, handle: JobHandle, host: int, lines: int) -> Plan[str | None]:
        ns, name = self.where(handle)
        pods = yield from self._pods_plan(ns, name)
        jobset = yield from self._owner_plan(ns, name)
        current = k8s_slices.current_pods(jobset, pods) if jobset else pods
        hosts = max((h for _, h in map(k8s_slices.slice_host, current)), default=0) + 1
        want = divmod(host, hosts)
        pod = next((p for p in current if k8s_slices.slice_host(p) == want), None)
        if pod is None:
            return None
        kwargs = {"container": CONTAINER_NAME, "tail_lines": lines}
        call = Call("CoreV1Api", "read_namespaced_pod_log", (pod["metadata"]["name"], ns), kwargs)
        reply = yield call
        return reply.body.decode("utf-8", "replace") if reply.ok else None

    def _delete_plan(self, ownership: Ownership, uid: str | None) -> Plan[Reply]:
        """Delete the JobSet (foreground: its Jobs and pods first) if it still has ``uid``."""
        return (
            yield self._custom(
                "delete_namespaced_custom_object",
                ownership.namespace,
                JOBSET_PLURAL,
                ownership.name,
                body=delete_options(uid),
                propagation_policy="Foreground",
            )
        )
