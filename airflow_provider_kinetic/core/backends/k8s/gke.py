"""The GKE backend: one batch/v1 Job per run, through the official ``kubernetes`` client.

Each operation (create with its Secret, status with the pods and events that explain
a wait, a batch's status in two list calls, logs, cancel) is a *plan* of API calls
(``k8s/api.py``), run by the sync or the async driver; the status plans, single and
listed, are ``k8s/reads.py``'s, the create and the cancel with their ownership proof
``k8s/writes.py``'s, what the replies mean is ``k8s/status.py``'s and
``k8s/logs.py``'s business, console links ``k8s/console.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_kinetic.core.backends.base import Backend, TargetConfig
from airflow_provider_kinetic.core.backends.k8s import logs as k8s_logs
from airflow_provider_kinetic.core.backends.k8s import status as k8s_status
from airflow_provider_kinetic.core.backends.k8s.api import (
    ApiClientFactory,
    AsyncApiClientFactory,
    Call,
    KubernetesApiError,
    Plan,
    PlanDriver,
)
from airflow_provider_kinetic.core.backends.k8s.console import job_console_url, logging_url
from airflow_provider_kinetic.core.backends.k8s.manifests import GROUP_LABEL, job_manifest, job_name
from airflow_provider_kinetic.core.backends.k8s.reads import Listed, StatusReads
from airflow_provider_kinetic.core.backends.k8s.writes import OwnedWrites
from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport
from airflow_provider_kinetic.core.spec.pod import CONTAINER_NAME, JobSpec, label_value

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.storage import GcsStore

__all__ = ["GkeBackend", "KubernetesApiError", "Listed"]

log = logging.getLogger(__name__)
_UNREAD: Any = object()


class GkeBackend(PlanDriver, StatusReads, OwnedWrites, Backend):
    """Runs each job as a batch/v1 Job (``kinetic-{job_id}``) on a GKE cluster.

    ``api_client_factory`` returns a ``kubernetes.client.ApiClient``; production
    passes :func:`~airflow_provider_kinetic.gcp.gke_auth.gke_api_client_factory`,
    tests one pointed at a loopback API double.  If the factory has an
    ``invalidate()`` method it is called before a rebuild after a 401, and an
    ``async_client()`` method is used for the async path (else the async client is
    derived from the sync client's configuration).
    """

    name = "gke"
    auto_candidate = True
    needs_cluster = True
    #: The console's word for this backend's object kind (``console_url``).
    console_kind = "job"
    #: The kind of the object each job is (named in ownership conflicts).
    owned_kind = "Job"
    #: The deployment's signing secret (bytes or a keyring), set by the Airflow layer:
    #: objects are created with its owner token and proven ours by it
    #: (``k8s/ownership.py``); ``None``: the labels alone prove ownership.
    owner_secret: bytes | None = None

    # ---- the kind ---------------------------------------------------------------
    @classmethod
    def preflight(cls, accelerator: Accelerator, requested: str | None = None) -> None:
        if accelerator.is_multi_host:
            raise ValueError(
                f"accelerator {accelerator.canonical!r} spans {accelerator.num_nodes} hosts; "
                "a GKE Job runs one pod: use backend 'pathways' or 'auto'"
            )

    @classmethod
    def bucket_for(cls, config: TargetConfig) -> str:
        """Explicit ``bucket``, or kinetic's ``{project}-kn-{cluster}-jobs``."""
        if config.bucket:
            return config.bucket
        if config.project and config.cluster:
            return f"{config.project}-kn-{config.cluster}-jobs"
        raise ValueError("set 'bucket', or 'project' and 'cluster', for a GKE kinetic target")

    @classmethod
    def store_for(cls, config: TargetConfig) -> GcsStore:
        from airflow_provider_kinetic.core.storage import GcsStore

        return GcsStore(cls.bucket_for(config), project=config.project)

    @classmethod
    def cluster_fields_missing(cls, config: TargetConfig) -> list[str]:
        """Connection extras a cluster backend cannot do without."""
        return [f for f in ("project", "zone", "cluster") if not getattr(config, f)]

    @classmethod
    def from_config(
        cls, config: TargetConfig, api_client_factory: Callable[[], Any] | None = None
    ) -> GkeBackend:
        missing = cls.cluster_fields_missing(config)
        if missing:
            raise ValueError(
                f"the {cls.name} backend needs the connection extras {', '.join(missing)}"
            )
        if api_client_factory is None:
            raise ValueError(f"the {cls.name} backend needs Kubernetes API credentials")
        return cls(
            api_client_factory,
            namespace=config.namespace,
            image_pull_grace_s=config.image_pull_grace_s,
            schedule_timeout_s=config.schedule_timeout_s,
            create_grace_s=config.create_grace_s,
        )

    @classmethod
    def manifest(cls, spec: JobSpec) -> dict[str, Any]:
        return job_manifest(spec)

    @classmethod
    def object_name(cls, job_id: str) -> str:
        return job_name(job_id)

    @classmethod
    def logs_url(cls, handle: JobHandle) -> str | None:
        """Cloud Logging, filtered to the job's containers (pods carry ``job-id``)."""
        return logging_url(
            handle.project, handle.cluster_name, handle.namespace, "job-id", handle.job_id
        )

    @classmethod
    def group_logs_url(
        cls, group_id: str, project: str, cluster: str, namespace: str
    ) -> str | None:
        return logging_url(project, cluster, namespace, GROUP_LABEL, label_value(group_id))

    @classmethod
    def console_url(cls, handle: JobHandle) -> str:
        return job_console_url(
            cls.console_kind,
            handle.zone,
            handle.cluster_name,
            handle.namespace,
            handle.k8s_name,
            handle.project,
        )

    def __init__(
        self,
        api_client_factory: ApiClientFactory,
        *,
        namespace: str = "default",
        async_api_client_factory: AsyncApiClientFactory | None = None,
        image_pull_grace_s: float = 300.0,
        schedule_timeout_s: float | None = 1800.0,
        create_grace_s: float = 180.0,
    ):
        super().__init__(api_client_factory, async_api_client_factory)
        self.namespace = namespace
        self.limits = k8s_status.Limits(image_pull_grace_s, schedule_timeout_s, create_grace_s)

    # ---- the Backend API --------------------------------------------------------
    def submit(self, spec: JobSpec) -> None:
        self._run(self._submit_plan(spec))

    def status(self, handle: JobHandle) -> StatusReport:
        return self._run(self._status_plan(handle))

    def read_logs(
        self, handle: JobHandle, offset: int = 0, max_bytes: int | None = None
    ) -> tuple[str, int]:
        read = self._run(self._logs_plan(handle, offset, max_bytes))
        return read if isinstance(read, tuple) else read.finish()

    def cancel(self, handle: JobHandle) -> None:
        self._run(self._cancel_plan(handle))

    def exists(self, handle: JobHandle) -> bool:
        """Whether the handle's job exists: an object of its name that is proven its own
        (someone else's object of that name is not this job)."""
        proof = self._run(self._owned_plan(self._handle_ownership(handle)))
        if proof.found is not None and not proof.owned:
            log.warning(
                "%s %s/%s exists but is not job %s's (%s)",
                self.owned_kind,
                *self.where(handle),
                handle.job_id,
                proof.why,
            )
        return proof.owned

    def batch_status(self, group_id: str, handles: list[JobHandle]) -> dict[str, StatusReport]:
        return self._run(self._batch_plan(group_id, handles))

    async def abatch_status(
        self, group_id: str, handles: list[JobHandle]
    ) -> dict[str, StatusReport]:
        return await self._arun(self._batch_plan(group_id, handles))

    async def astatus(self, handle: JobHandle) -> StatusReport:
        return await self._arun(self._status_plan(handle))

    async def aread_logs(
        self, handle: JobHandle, offset: int = 0, max_bytes: int | None = None
    ) -> tuple[str, int]:
        read = await self._arun(self._logs_plan(handle, offset, max_bytes))
        # Parsing a pod's log (megabytes, for a chatty job) is CPU work: off the loop.
        return read if isinstance(read, tuple) else await asyncio.to_thread(read.finish)

    async def aread_logs_of(
        self,
        handle: JobHandle,
        pod: dict[str, Any] | None,
        offset: int,
        max_bytes: int | None,
        shared: list[Any] | None = None,
    ) -> tuple[str, int]:
        """:meth:`aread_logs` from the pod a listed read found (``Listed.log_pod``): one
        call, not two (on the ``shared`` client, see ``PlanDriver._arun``)."""
        read = await self._arun(self._logs_plan(handle, offset, max_bytes, pod), shared)
        return read if isinstance(read, tuple) else await asyncio.to_thread(read.finish)

    async def alisted(
        self,
        namespace: str,
        selector: str,
        handles: list[JobHandle],
        shared: list[Any] | None = None,
    ) -> dict[str, Listed]:
        """Many jobs' status from one list by ``selector`` (:meth:`_listed_plan`); a
        missing job's own read failing is that job's answer alone."""
        plan = self._listed_plan(namespace, selector, handles, isolate=True)
        return await self._arun(plan, shared)

    async def acancel(self, handle: JobHandle) -> None:
        await self._arun(self._cancel_plan(handle))

    def port_forward(self, handle: JobHandle, remote_port: int, local_port: int = 0) -> Any:
        """A port-forward from ``127.0.0.1:local_port`` to ``remote_port`` of the job's
        pod (the one its log comes from; debug mode), not yet started; None while the
        job has no pod."""
        from airflow_provider_kinetic.core.backends.k8s.portforward import PortForward

        ns, name = self.where(handle)
        pod = self._run(self._log_pod_plan(ns, name))
        if pod is None:
            return None
        pod_name = (pod.get("metadata") or {}).get("name", "")
        return PortForward(self._factory, ns, pod_name, remote_port, local_port)

    # ---- plans (no I/O) ---------------------------------------------------------
    def where(self, handle: JobHandle) -> tuple[str, str]:
        """(namespace, object name) of the job named by ``handle``."""
        name = handle.k8s_name or self.object_name(handle.job_id)
        return handle.namespace or self.namespace, name

    def _submit_plan(self, spec: JobSpec) -> Plan[None]:
        if spec.accelerator.is_multi_host:
            log.warning(
                "%s spans %d hosts but runs as one pod; the pathways backend runs one pod per host",
                spec.accelerator.canonical,
                spec.accelerator.num_nodes,
            )
        body = self._stamped(job_manifest(spec))
        call = Call("BatchV1Api", "create_namespaced_job", (spec.namespace, body))
        yield from self._with_secrets(spec, call, self._ownership_of("Job", body))

    def _log_pod_plan(self, ns: str, name: str) -> Plan[dict[str, Any] | None]:
        """The pod whose log is the job's log (kinetic: the status pick)."""
        return k8s_status.select_pod((yield from self._pods_plan(ns, name)))

    def _logs_plan(
        self, handle: JobHandle, offset: int, max_bytes: int | None, pod: Any = _UNREAD
    ) -> Plan[tuple[str, int] | k8s_logs.LogTail]:
        """The read's result, or the :class:`~k8s_logs.LogTail` that makes it (its
        ``finish()`` parses the log: the caller decides on which thread).  ``pod``:
        the log's pod as a listed read found it (else it is looked up first)."""
        ns, name = self.where(handle)
        if pod is _UNREAD:
            pod = yield from self._log_pod_plan(ns, name)
        if pod is None:
            return "", offset
        meta = pod.get("metadata") or {}
        pod_name = meta.get("name", "")
        tail = k8s_logs.LogTail((ns, pod_name, meta.get("uid", "")), offset, max_bytes)
        if tail.has_pending():  # a capped read: the last read fetched these lines already
            return tail
        kwargs = {"container": CONTAINER_NAME, "timestamps": True, **tail.request_kwargs()}
        reply = yield Call("CoreV1Api", "read_namespaced_pod_log", (pod_name, ns), kwargs)
        if reply.status in (400, 404):  # container not started yet, or pod gone
            return "", offset
        if not reply.ok:
            raise KubernetesApiError(f"reading the log of {pod_name}", reply)
        tail.body = reply.body
        return tail
