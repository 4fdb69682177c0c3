"""``attach(job_id)``: operate a job from plain Python (a notebook, a CLI, another task).

Give it a job id (read from the connection's store) or the ``kinetic_job`` XCom dict.
A handle read from the store is only trusted for the job id and the backend kind:
its object name, namespace and bucket come from the connection, and its result must
be signed, so a forged ``handle.json`` cannot point ``cancel`` at another object or
make ``result`` accept a substituted payload.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.cleanup import release
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.signing import AUTH_HMAC
from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport, artifact_key
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.signing import result_key
from airflow_provider_kinetic.hooks.kinetic import KineticHook


class AttachedJob:
    """One job, operated through its connection (status, logs, result, cancel, cleanup)."""

    def __init__(self, handle: JobHandle, hook: KineticHook):
        self.handle = handle
        self._hook = hook
        self._backend: Backend | None = None

    @property
    def job_id(self) -> str:
        return self.handle.job_id

    @property
    def store(self) -> ObjectStore:
        return self._hook.get_store()

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self._hook.get_backend(self.handle.backend)
        return self._backend

    def status(self) -> StatusReport:
        """Its backend's report; a job its backend released once its outcome was
        collected (NOT_FOUND) as its history says it ended."""
        return history.settled(self.store, self.job_id, self.backend.status(self.handle))

    def logs(self) -> str:
        """The job's whole log so far."""
        return self.backend.read_logs(self.handle, 0)[0]

    def tail(self, follow: bool = False, poll_interval: float = 1.0) -> Iterator[str]:
        """Log lines; with ``follow``, new ones as they come until the job ends."""
        offset = 0
        while True:
            done = self.status().status.is_terminal  # before the read: no line is lost
            text, offset = self.backend.read_logs(self.handle, offset)
            yield from text.splitlines()
            if done or not follow:
                return
            time.sleep(poll_interval)

    def result(self, timeout: float | None = None, poll_interval: float = 1.0) -> Any:
        """Wait for the job to end; its value, or its remote exception raised here."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (report := self.status()).status.is_terminal:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"kinetic job {self.job_id} still {report.status.value}")
            time.sleep(poll_interval)
        return collect(
            self.store,
            self.job_id,
            report.status,
            report.reason,
            result_key=result_key(self.handle),
        )

    def cancel(self) -> None:
        """Stop the job; no later try of its task will adopt it."""
        request_cancel(self.store, self.backend, self.handle)

    def cleanup(self) -> int:
        """Delete the finished job's cluster object and its ``{job_id}/`` artifacts."""
        if not self.status().status.is_terminal:
            raise RuntimeError(f"kinetic job {self.job_id} is still running: cancel it first")
        self.backend.cancel(self.handle)
        release(self.store, self.backend, [self.handle])  # its log kept in the history
        return self.store.delete_prefix(f"{self.job_id}/")

    def __repr__(self) -> str:
        return f"AttachedJob({self.job_id!r}, backend={self.handle.backend!r})"


def attach(job: str | dict[str, Any] | JobHandle, conn_id: str = "kinetic_default") -> AttachedJob:
    """An :class:`AttachedJob` for a job id, a ``kinetic_job`` XCom dict or a handle."""
    hook = KineticHook(conn_id)
    if not isinstance(job, str):
        return AttachedJob(JobHandle.from_dict(job), hook)
    config = hook.get_config()
    store = hook.get_store()
    stored = JobHandle.from_dict(json.loads(store.read_bytes(artifact_key(job, "handle.json"))))
    if stored.job_id != job:
        raise ValueError(f"{store.uri(artifact_key(job, 'handle.json'))} names {stored.job_id}")
    kind = backend_class(stored.backend)  # an unknown kind is an error naming it
    handle = stored.evolve(
        k8s_name=kind.object_name(job),
        namespace=config.namespace,
        bucket_name=store.bucket,
        result_auth=AUTH_HMAC,
    )
    return AttachedJob(handle, hook)
