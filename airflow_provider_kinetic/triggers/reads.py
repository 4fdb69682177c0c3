"""Where a job trigger's status and log reads come from: its own, or the triggerer's shared ones.

A backend that can answer many jobs from one list (``alisted``: the cluster backends)
is read through the event loop's shared readers
(:mod:`~airflow_provider_kinetic.core.backends.shared_reads`): one list per cluster
and namespace per interval for every deferred job, and live log reads granted from
one budget.  Any other backend (the local one waits on its job's exit-code file)
keeps its own reads.  Both look the same to ``KineticJobTrigger._run``: ``status``,
``log_cap``, ``read_logs``, ``wait``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_kinetic.core.backends import shared_reads
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport


class OwnReads:
    """One job's reads by itself: a status read per poll, a log read per poll."""

    def __init__(self, backend: Any, job: JobHandle, poll_interval: float) -> None:
        self.backend, self.job = backend, job
        self._delays = poll_delays(poll_interval, backend.first_poll_s)

    async def status(self, log_bytes: int | None) -> StatusReport:
        return await self.backend.astatus(self.job)

    def log_cap(self, log_bytes: int, final: bool) -> int | None:
        """The most this poll may read of the log (``None``: no read this poll)."""
        return log_bytes

    async def read_logs(self, offset: int, cap: int, final: bool) -> tuple[str, int]:
        return await self.backend.aread_logs(self.job, offset, cap)

    async def wait(self) -> None:
        """Until the next poll (the backend may return early when the job ends)."""
        await self.backend.await_change([self.job], next(self._delays))


class SharedJobReads(OwnReads):
    """A job's reads through the loop's shared reader: its status from the reader's
    list, a live log read when the budget grants one, a finished job's log in full."""

    def __init__(
        self, backend: Any, job: JobHandle, poll_interval: float, sub: shared_reads.Subscription
    ) -> None:
        super().__init__(backend, job, poll_interval)
        self.sub = sub
        self._due = sub.reads.clock.now()  # the first poll: the next list
        self._seen: shared_reads.Seen | None = None

    async def status(self, log_bytes: int | None) -> StatusReport:
        try:
            self._seen = await self.sub.next(self._due, log_bytes)
            return self._seen.report
        except shared_reads.SharedReadFailed:
            self._seen = None  # this poll on its own (the backend's retries, its errors)
            return await self.backend.astatus(self.job)

    def log_cap(self, log_bytes: int, final: bool) -> int | None:
        if final or self._seen is None:
            return log_bytes
        return self._seen.log_cap

    async def read_logs(self, offset: int, cap: int, final: bool) -> tuple[str, int]:
        seen, reader = self._seen, self.sub.reader
        known = seen is not None and seen.listed and (seen.log_pod is not None or not final)
        if known and reader.alive:  # the pod is known: one call (a drain looks again)
            pod = seen.log_pod
            read = await self.backend.aread_logs_of(self.job, pod, offset, cap, reader.client)
        else:
            read = await self.backend.aread_logs(self.job, offset, cap)
        if final:
            self.sub.spend(1, len(read[0].encode()))
        return read

    async def wait(self) -> None:
        if self._seen is None:  # no shared answer: wait as an own read would
            await super().wait()
            self._due = self.sub.reads.clock.now()
            return
        # Counted from the list, not from now: every job of one list is due at the
        # same time, so the next list answers them all.
        self._due = self._seen.at + next(self._delays)


def reader_key(job: JobHandle, config: str, namespace: str) -> tuple[str, str, str]:
    """Who may share a list: the same kind, connection (credentials, cluster, limits:
    the whole config) and namespace."""
    return job.backend, hashlib.sha256(config.encode()).hexdigest()[:16], namespace


@contextlib.asynccontextmanager
async def reads_for(
    backend: Any, job: JobHandle, config: str, poll_interval: float
) -> AsyncIterator[OwnReads]:
    """The reads a trigger uses for ``job`` while inside (it leaves its reader on exit,
    cancelled or not)."""
    if not callable(getattr(backend, "alisted", None)):
        yield OwnReads(backend, job, poll_interval)
        return
    key = reader_key(job, config, backend.where(job)[0])
    async with shared_reads.registry().subscribe(key, backend, job, poll_interval) as sub:
        yield SharedJobReads(backend, job, poll_interval, sub)
