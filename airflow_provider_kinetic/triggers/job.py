"""KineticJobTrigger: wait for one job on the triggerer without blocking its event loop.

Kwargs are JSON only (handle dict, config JSON, numbers) so the trigger can be
re-created on another machine.  It yields exactly one event with a ``status`` of
``SUCCEEDED``/``FAILED``/``NOT_FOUND`` (terminal job states), ``timeout`` (the
task's deadline passed) or ``error`` (the trigger itself failed).  A store it cannot
read (a local mount gone for a while) is no answer about the job: the poll is retried
for ``[kinetic] store_outage_window_s`` (``core.jobs.polling.StoreOutage``).

It shares the triggerer's event loop with every other trigger, so no step may hold
the loop: the job's log is read in chunks of ``log_bytes_per_poll`` (the rest comes
with the next polls; a finished job's log is drained, chunk by chunk, before the
event), each read runs off the loop, and writing a chunk's lines into the task log
yields to the loop every ``YIELD_EVERY_S`` (a job that printed 18 MB once held it
for 12.9 s, stalling every other trigger).

On a cluster its status and log reads come from the triggerer's shared reader
(``triggers.reads``): one list per namespace per interval for every deferred job,
live log reads granted from one budget (a thousand deferred jobs cost about ten).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.triggers.base import BaseTaskEndEvent, BaseTrigger, TriggerEvent

from airflow_provider_kinetic.core.jobs.polling import StoreOutage
from airflow_provider_kinetic.core.logat import info_at, timed_lines
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.triggers.logplace import LogPlace, through_cancels
from airflow_provider_kinetic.triggers.settle import deferred_here, hold, not_before_from
from airflow_provider_kinetic.triggers.userkill import CancelOnUserKill

if TYPE_CHECKING:  # the reads are imported where they run (the triggerer), not at parse
    from airflow_provider_kinetic.triggers.reads import OwnReads

#: New log bytes a poll writes into the task log (the rest comes with the next polls).
LOG_BYTES_PER_POLL = 256 * 1024
#: Longest a trigger writes log lines before letting the loop run other triggers.
YIELD_EVERY_S = 0.01

T = TypeVar("T")


async def in_sdk_thread(func: Any, *args: Any) -> Any:
    """``func(*args)`` off the event loop in a thread from which the Task SDK's sync
    calls reach the triggerer (``asgiref``'s, as Airflow 3.1's channel needs)."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(func, thread_sensitive=False)(*args)


async def yielding(items: Iterable[T]) -> AsyncIterator[T]:
    """``items``, letting the event loop run other triggers every ``YIELD_EVERY_S``
    (writing log lines is synchronous: thousands of them would hold the loop)."""
    yielded = time.monotonic()
    for item in items:
        yield item
        if time.monotonic() - yielded > YIELD_EVERY_S:
            await asyncio.sleep(0)
            yielded = time.monotonic()


class KineticJobTrigger(CancelOnUserKill, BaseTrigger):
    """Poll a kinetic job's status until it is terminal.

    Args:
        handle: the JobHandle's wire dict (``JobHandle.to_dict()``).
        config: the target's KineticConfig as JSON (see ``hooks.kinetic.config_to_json``).
        poll_interval: seconds between status reads.
        deadline: epoch seconds after which a ``timeout`` event is sent (carries the
            task's ``execution_timeout``, which Airflow does not enforce while deferred).
        cancel_on_kill: cancel the job when a user marks the task failed / clears it.
        attempt: how many times the operator re-deferred after a trigger error
            (echoed in the event, which is all the operator gets back in dag.test).
        stream_logs: write the job's new log lines into the task log at every poll
            (the trigger's log is served with the task log), so a long job's output
            shows while the task is deferred; ``log_offset`` is where to continue
            (or the deferral's saved place after a triggerer restart:
            ``triggers.logplace``), and the event returns the final offset.
        log_bytes_per_poll: at most this much of the log is shown per poll (a
            finished job's log is shown in full, in chunks of this size).
        not_before: epoch seconds before which no event is sent (``triggers.settle``);
            set when the trigger is made, at deferral.
        end_task: ``triggers.end_task.EndTask`` as a dict: when the job succeeds, the
            trigger finishes it and ends the task itself (no hold, no worker after
            it) where the value allows; None: the task resumes on a worker.
    """

    def __init__(
        self,
        handle: dict[str, Any],
        config: str,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        cancel_on_kill: bool = True,
        attempt: int = 0,
        stream_logs: bool = True,
        log_offset: int = 0,
        not_before: float | None = None,
        log_bytes_per_poll: int = LOG_BYTES_PER_POLL,
        end_task: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.end_task = end_task
        #: The job's final report, once ``_poll`` has seen it.
        self._final: StatusReport | None = None
        self._watch: Any = None  # core.jobs.progress.ProgressWatch, made at the first read
        self._store_made: Any = None  # the store (``_store``), made at its first use
        self.not_before = not_before_from(not_before)
        self.attempt = attempt
        self.stream_logs = stream_logs
        self.log_offset = log_offset
        self._place = LogPlace(self._store, handle["job_id"], self.not_before, log_offset, self)
        self.log_bytes_per_poll = log_bytes_per_poll
        self.handle = handle
        self._job = JobHandle.from_dict(handle)
        self.config = config
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.cancel_on_kill = cancel_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "handle": self.handle,
                "config": self.config,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "cancel_on_kill": self.cancel_on_kill,
                "attempt": self.attempt,
                "stream_logs": self.stream_logs,
                "log_offset": self.log_offset,
                "not_before": self.not_before,
                "log_bytes_per_poll": self.log_bytes_per_poll,
                "end_task": self.end_task,
            },
        )

    def _backend(self):  # noqa: ANN202 - Backend; imported lazily for the triggerer
        from airflow_provider_kinetic.deployment.backends import backend_for
        from airflow_provider_kinetic.deployment.connection import config_from_json

        return backend_for(config_from_json(self.config), self._job.backend)

    def _event(self, status: str, message: str = "", reason: str | None = None) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "message": message,
                "reason": reason,
                "handle": self.handle,
                "deadline": self.deadline,
                "attempt": self.attempt,
                "log_offset": self.log_offset,
            }
        )

    async def _show_logs(self, reads: OwnReads, final: bool = False) -> bool:
        """The next chunk of the job's log into the task log (each line once, at its
        time where known); whether there was one.  ``final``: the job has ended and
        its log is being drained (a shared reader rations only live reads)."""
        if not self.stream_logs:
            return False
        cap = reads.log_cap(self.log_bytes_per_poll, final)
        if cap is None:  # not this job's turn in the triggerer's log budget
            return False
        text, offset = await reads.read_logs(self.log_offset, cap, final)
        moved, self.log_offset = offset != self.log_offset, offset
        async for line, ns in yielding(timed_lines(text)):
            info_at(self.log, ns, "[%s] %s", self._job.job_id, line)  # at the job's time
        if moved and self._place.due(offset):
            await asyncio.to_thread(self._place.save, offset)
        return moved

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in self._run():
            if not isinstance(event, BaseTaskEndEvent):  # it ends the task: nothing to race
                await hold(self.not_before)
            yield event

    async def _run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_kinetic.deployment.connection import store_outage_window_s
        from airflow_provider_kinetic.deployment.metrics import trigger_scope
        from airflow_provider_kinetic.triggers.reads import reads_for

        job_id = self._job.job_id
        try:
            trigger_scope(self, None, self._job.accelerator, self._job.backend)  # its metrics
            backend = await asyncio.to_thread(self._backend)
            event = await self._ended_before()
            if event is None:
                if self.stream_logs:
                    self.log_offset = await asyncio.to_thread(self._place.resume, self.log_offset)
                warm = self._warm()  # the Task SDK's channel, while the job runs
                async with reads_for(backend, self._job, self.config, self.poll_interval) as r:
                    try:
                        event = await self._poll(r, StoreOutage(store_outage_window_s()))
                    except asyncio.CancelledError:  # the triggerer stops it: keep its place
                        await through_cancels(asyncio.to_thread(self._place.save, self.log_offset))
                        raise
                if warm is not None:
                    await warm  # one call at a time through the channel
                if self._final is not None and self._final.status is JobStatus.SUCCEEDED:
                    event = await self._end_task(backend, self._final) or event
        except Exception as exc:  # noqa: BLE001 - never let run() die without an event
            self.log.exception("kinetic trigger for %s failed", job_id)
            event = self._event("error", f"{type(exc).__name__}: {exc}")
        yield event  # after leaving the shared reader: a held event waits for nothing

    async def _poll(self, reads: OwnReads, outage: StoreOutage) -> TriggerEvent:
        """Status (and new log lines) every poll until the job ends or the deadline
        passes; the event that says which."""
        job_id = self._job.job_id
        last: str | None = None
        log_bytes = self.log_bytes_per_poll if self.stream_logs else None
        while True:
            try:
                report = await reads.status(log_bytes)
            except OSError as exc:  # the store cannot be read: no answer about the job
                delay = outage.failed(exc)  # re-raised once the window has passed
                self.log.warning("kinetic job %s: %s", job_id, outage.describe(exc, delay))
                await asyncio.sleep(delay)
                continue
            if (lasted := outage.recovered()) is not None:
                self.log.info("kinetic job %s: the store is back after %.1fs", job_id, lasted)
            final = report.status.is_terminal
            more = await self._show_logs(reads, final)
            while more and final:  # drain it before the event
                more = await self._show_logs(reads, final)
            if report.status is JobStatus.RUNNING or final:
                await self._show_progress(final)
            if report.describe() != last:
                self.log.info("kinetic job %s: %s", job_id, report.describe())
                if "(NotAdmitted)" in (last or "") or (last is None and self._queued()):
                    await self._admitted(report.reason)
                last = report.describe()
            if report.status.is_terminal:
                self._final = report
                return self._event(report.status.value, report.message, report.reason)
            if self.deadline is not None and time.time() >= self.deadline:
                return self._event(
                    "timeout",
                    f"job {job_id} still {report.status.value} at the task's execution deadline",
                )
            await reads.wait()

    async def _show_progress(self, final: bool) -> None:
        """What the function reported (``core.jobs.progress``): a store read, no
        cluster request; a task-log line when the step or a metric changed."""
        if self._watch is None:
            from airflow_provider_kinetic.core.jobs.progress import ProgressWatch

            try:
                store = await asyncio.to_thread(self._store)
            except Exception as exc:  # noqa: BLE001 - progress never fails the wait
                self.log.warning("kinetic job %s: no progress: %s", self._job.job_id, exc)
                self._watch = False
                return
            self._watch = ProgressWatch(store, self._job.job_id)
        if self._watch is False or not self._watch.due(final):
            return
        if (line := await asyncio.to_thread(self._watch.poll, final)) is not None:
            self.log.info("kinetic job %s: %s", self._job.job_id, line)

    def _ends_task(self) -> bool:
        """Whether this trigger may end its task itself (``triggers.end_task``): the
        operator said so, and it does not run in the deferring process (``dag.test()``
        resumes the task with the event's payload)."""
        return self.end_task is not None and not deferred_here(self.not_before)

    def _warm(self) -> asyncio.Future | None:
        """A trigger that may end its task warms the Task SDK's channel in the
        background (``triggers.end_task.warm_channel``); None when it will not."""
        if not self._ends_task() or not (self.end_task or {}).get("collect", True):
            return None
        from airflow_provider_kinetic.triggers.end_task import warm_channel

        identity = dict((self.end_task or {}).get("identity") or {})
        return asyncio.ensure_future(in_sdk_thread(warm_channel, identity))

    async def _ended_before(self) -> TriggerEvent | None:
        """A trigger of this try already ended the task and its event was lost (the
        triggerer died in between): the same XComs again, from the task's record."""
        if not self._ends_task():
            return None
        from airflow.triggers.base import TaskSuccessEvent

        from airflow_provider_kinetic.triggers.end_task import EndTask, handed_before

        end = EndTask.from_dict(self.end_task or {})
        if not end.collect:  # no value, no record: a lost event's job reads as ended
            return None
        store, secret = await asyncio.to_thread(self._store_and_secret)
        if await in_sdk_thread(handed_before, store, secret, self._job, end) is None:
            return None
        self.log.info("kinetic job %s: ended the task before; ending it again", self._job.job_id)
        return TaskSuccessEvent()

    async def _end_task(self, backend: Any, report: StatusReport) -> TriggerEvent | None:
        """Finish the succeeded job here and end the task with its value
        (``triggers.end_task``), or None: the task resumes on a worker, which finishes
        it (the reason is logged; nothing of the job was changed)."""
        if not self._ends_task():
            return None
        from airflow.triggers.base import TaskSuccessEvent

        from airflow_provider_kinetic.deployment.signing import result_key
        from airflow_provider_kinetic.triggers.end_task import (
            EndTask,
            NotHere,
            finish_here,
            handed_before,
        )

        job_id, end = self._job.job_id, EndTask.from_dict(self.end_task or {})
        store, secret = await asyncio.to_thread(self._store_and_secret)
        try:
            key = result_key(self._job)
            await in_sdk_thread(
                finish_here, store, backend, secret, self._job, report, end, key, self.log
            )
        except NotHere as exc:
            self.log.info("kinetic job %s: a worker finishes the task (%s)", job_id, exc)
            return None
        except Exception:  # noqa: BLE001 - the record says whether the value was handed
            self.log.exception("kinetic job %s: finishing it in the trigger failed", job_id)
            if await in_sdk_thread(handed_before, store, secret, self._job, end) is None:
                return None
        self.log.info("kinetic job %s: the trigger ends the task with its value", job_id)
        await self._push_progress(end.identity)
        return TaskSuccessEvent()

    async def _push_progress(self, identity: dict[str, Any]) -> None:
        """The function's last progress report as XCom ``kinetic_progress``, as a
        worker's finish pushes it (the final poll read it: the job's dir is gone now).
        Never fails the task: its value is Airflow's already."""
        last = getattr(self._watch, "last", None)
        if last is None:
            return
        from airflow_provider_kinetic.triggers.end_task import push_xcoms

        try:
            await in_sdk_thread(push_xcoms, identity, {"kinetic_progress": last.to_xcom()})
        except Exception as exc:  # noqa: BLE001
            self.log.warning("kinetic job %s: progress XCom not pushed: %s", self._job.job_id, exc)

    def _store(self) -> Any:
        """The job's store, made once per trigger (each use below shares it)."""
        if self._store_made is None:
            from airflow_provider_kinetic.deployment.connection import config_from_json
            from airflow_provider_kinetic.gcp.gcs_auth import store_for

            self._store_made = store_for(config_from_json(self.config))
        return self._store_made

    def _store_and_secret(self) -> tuple[Any, Any]:
        from airflow_provider_kinetic.deployment.signing import deployment_secret

        return self._store(), deployment_secret()

    def _queued(self) -> bool:
        """Whether the job waits in a Kueue queue: Kueue may admit it between the
        worker's last look and this trigger's first, which then notes it (late by at
        most a poll; a note already made is kept)."""
        return (self._job.capacity or "").startswith("queue:")

    async def _admitted(self, reason: str | None) -> None:
        """Kueue let a queued job in (it left NotAdmitted): its usage splits the wait
        into waiting for admission and for a node.  An account only: never fails."""
        from airflow_provider_kinetic.core.backends.k8s.status import REASON_NOT_ADMITTED
        from airflow_provider_kinetic.core.jobs.usage import note_admitted

        if reason == REASON_NOT_ADMITTED:
            return
        try:
            store = await asyncio.to_thread(self._store)
            await asyncio.to_thread(note_admitted, store, self._job.job_id, time.time())
        except Exception as exc:  # noqa: BLE001 - an account, never the job's outcome
            self.log.warning("could not record the admission of %s: %s", self._job.job_id, exc)

    async def on_kill(self) -> None:
        """Airflow 3.3+: runs on user mark-failed/clear only (not triggerer restarts)."""
        if not self.cancel_on_kill:
            return
        from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
        from airflow_provider_kinetic.deployment.connection import config_from_json

        backend = await asyncio.to_thread(self._backend)
        from airflow_provider_kinetic.gcp.gcs_auth import store_for

        store = store_for(config_from_json(self.config))
        self.log.info("task killed by user: cancelling kinetic job %s", self._job.job_id)
        # The marker first, so the next try never adopts a job that is being cancelled.
        await asyncio.to_thread(request_cancel, store, backend, self._job)
