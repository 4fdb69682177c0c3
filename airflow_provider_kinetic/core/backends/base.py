"""The backend contract: create a job from a JobSpec, read its status and logs, cancel it.

Status and log reads take only the handle dict, so any process (worker, triggerer,
a retry on another machine) can ask about a job it did not start.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.handles import JobStatus
from airflow_provider_kinetic.core.jobspec import JobSpec


@dataclass(frozen=True)
class StatusReport:
    """A status plus the reason a person needs to act on it (shown in the task log)."""

    status: JobStatus
    reason: str | None = None
    message: str = ""

    def describe(self) -> str:
        text = self.status.value
        if self.reason:
            text += f" ({self.reason})"
        if self.message:
            text += f": {self.message}"
        return text


class Backend(abc.ABC):
    """Where jobs run: a local process, a GKE Job, or a LeaderWorkerSet."""

    name: str

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> None:
        """Create the job; raises if it could not be created."""

    @abc.abstractmethod
    def status(self, handle: dict[str, Any]) -> StatusReport:
        """Current status of the job named by ``handle``."""

    @abc.abstractmethod
    def read_logs(self, handle: dict[str, Any], offset: int = 0) -> tuple[str, int]:
        """Log text after ``offset`` and the new offset (so no line is shown twice)."""

    @abc.abstractmethod
    def cancel(self, handle: dict[str, Any]) -> None:
        """Stop the job; a job that is already gone is not an error."""

    def batch_status(self, group_id: str, handles: list[dict[str, Any]]) -> dict[str, StatusReport]:
        """Status of many children of one batch, keyed by job id.

        Backends answer with one query per call (GKE: one list by the group label;
        local: one scan of the state dir), whatever the number of children.
        """
        return {h["job_id"]: self.status(h) for h in handles}

    async def abatch_status(
        self, group_id: str, handles: list[dict[str, Any]]
    ) -> dict[str, StatusReport]:
        return await asyncio.to_thread(self.batch_status, group_id, handles)

    def object_name(self, job_id: str) -> str:
        """Name of the object this backend creates for a job (kinetic's naming)."""
        return f"kinetic-{job_id}"

    def exists(self, handle: dict[str, Any]) -> bool:
        return self.status(handle).status is not JobStatus.NOT_FOUND

    def manifest(self, spec: JobSpec) -> dict[str, Any]:
        """What ``submit`` would create, as a dict (dry run)."""
        return {"kind": "LocalProcess", "command": spec.command, "args": spec.args, "env": spec.env}

    # Async wrappers for triggers: implementations with native async clients override.
    async def astatus(self, handle: dict[str, Any]) -> StatusReport:
        return await asyncio.to_thread(self.status, handle)

    async def aread_logs(self, handle: dict[str, Any], offset: int = 0) -> tuple[str, int]:
        return await asyncio.to_thread(self.read_logs, handle, offset)

    async def acancel(self, handle: dict[str, Any]) -> None:
        await asyncio.to_thread(self.cancel, handle)
