"""KineticBatchTrigger: drive a deferred batch to its end (or, from older versions,
wait until any active child finishes).

One ``batch_status`` query per poll covers every active child, so a trigger holding
a 1,000-child batch makes O(1) API calls per poll.  With ``drive`` (what the map
operator defers with) the trigger itself folds finished children in, retries them
and launches queued ones as slots free up (``triggers.batch_drive``), and fires
once, when the whole batch has finished: one deferral per try, and the worker
resumes only to collect.  Without it (a trigger serialized by an older version) it
fires as soon as one child is terminal, for the operator to launch the next.

Like the job trigger it shares the triggerer's loop: each child's log read is capped
at ``log_bytes_per_poll`` (:class:`_CappedReads`; a child that has just finished is
shown a chunk here and the rest by the operator on resume, from the offset in the
state) and the lines are written yielding to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.jobs.polling import StoreOutage, poll_delays
from airflow_provider_kinetic.core.logat import info_at
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.triggers.batch_drive import BatchDriver, finished_event
from airflow_provider_kinetic.triggers.job import in_sdk_thread, yielding
from airflow_provider_kinetic.triggers.settle import deferred_here, hold, not_before_from, remaining
from airflow_provider_kinetic.triggers.userkill import CancelOnUserKill

log = logging.getLogger(__name__)
T = TypeVar("T")


async def to_the_end(work: asyncio.Future) -> None:
    """Wait until ``work`` (a thread's) has ended, even if this task is cancelled again
    meanwhile (3.1's triggerer cancels at every state sync); its error is logged, not
    raised: the trigger is stopping already.  A cancelled ``work`` task is done at
    once, its thread not: what must not overlap that thread locks against it."""
    while not work.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({work})
    if not work.cancelled() and (exc := work.exception()) is not None:
        log.warning("a stopping batch trigger's work failed: %s: %s", type(exc).__name__, exc)


class _CappedReads:
    """The backend as ``batchlogs.ashow`` reads logs through it on the triggerer:
    every read capped at ``max_bytes`` (``Backend.read_logs``), a finished child's
    too, so no read, and no batch of lines to write, is larger than that."""

    def __init__(self, backend: Any, max_bytes: int) -> None:
        self.backend = backend
        self.max_bytes = max_bytes

    async def aread_logs(
        self, handle: JobHandle, offset: int = 0, max_bytes: int | None = None
    ) -> tuple[str, int]:
        return await self.backend.aread_logs(handle, offset, self.max_bytes)


class KineticBatchTrigger(CancelOnUserKill, BaseTrigger):
    """Poll a batch's active children; one event when any is done (or on deadline/error).

    The operator's batch ``state`` (``BatchState.to_dict()``) rides along and comes
    back in every event: the operator resumes from the event alone, whatever carries
    ``next_kwargs``.

    Running children's new log lines go into the task log at every poll, prefixed
    ``[child N]``, at most ``log_bytes_per_poll`` per child (``0``: none); the
    offsets shown so far travel in the state (``log_offsets``), so the operator,
    or the next deferral, continues where this one stopped.

    No event before ``not_before`` (``triggers.settle``): children that end sooner
    are gathered into the first event.
    """

    def __init__(
        self,
        state: dict[str, Any],
        config: str,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        cancel_on_kill: bool = True,
        log_bytes_per_poll: int = batchlogs.LOG_BYTES_PER_POLL,
        not_before: float | None = None,
        drive: bool = False,
        end_task: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.drive = drive
        #: ``triggers.end_task.EndTask`` as a dict: once every child succeeded, the
        #: trigger may end the task itself (``triggers.end_batch``); None: a worker does.
        self.end_task = end_task
        self.not_before = not_before_from(not_before)
        self.log_bytes_per_poll = log_bytes_per_poll
        self.state = state
        self._batch = BatchState.from_dict(state)
        self.group_id = self._batch.group_id
        self.handles = list(self._batch.active.values())
        self.config = config
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.cancel_on_kill = cancel_on_kill
        self._work: asyncio.Future | None = None  # the driver's newest work in its thread
        self._progress: tuple[Any, Any] | None = None  # (BatchProgress, store), at first use

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "state": self.state,
                "config": self.config,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "cancel_on_kill": self.cancel_on_kill,
                "log_bytes_per_poll": self.log_bytes_per_poll,
                "not_before": self.not_before,
                "drive": self.drive,
                "end_task": self.end_task,
            },
        )

    def _backend(self):  # noqa: ANN202 - Backend, imported lazily for the triggerer
        from airflow_provider_kinetic.deployment.backends import backend_for
        from airflow_provider_kinetic.deployment.connection import config_from_json

        return backend_for(config_from_json(self.config), self._batch.backend)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_provider_kinetic.deployment.connection import store_outage_window_s
        from airflow_provider_kinetic.deployment.metrics import trigger_scope

        driver = None  # set once it has resumed: only then is the batch its to save
        try:
            template = self._batch.template  # its metrics: the batch's task, accelerator, backend
            trigger_scope(
                self, template.identity, template.options.accelerator, self._batch.backend
            )
            backend = await asyncio.to_thread(self._backend)
            if self.drive:
                if (ended := await self._ended_before()) is not None:
                    yield ended
                    return
                made = await asyncio.to_thread(
                    BatchDriver.for_trigger, self.config, backend, self.log
                )
                self._batch = await self._driver_work(made.resume, self._batch)
                driver = made
                self._sync_state()
            delays = poll_delays(self.poll_interval, backend.first_poll_s)
            outage = StoreOutage(store_outage_window_s())
            line = batchlogs.StatusLine()
            while True:
                try:
                    reports = (
                        await backend.abatch_status(self.group_id, self.handles)
                        if self.handles
                        else {}
                    )
                    if driver is not None:
                        await self._show_logs(backend, reports)
                        await self._driver_work(driver.step, self._batch, reports)
                        self._sync_state()
                except OSError as exc:  # the store cannot be read: no answer about the children
                    delay = outage.failed(exc)  # re-raised once the window has passed
                    self.log.warning("batch %s: %s", self.group_id, outage.describe(exc, delay))
                    await asyncio.sleep(delay)
                    continue
                if (lasted := outage.recovered()) is not None:
                    self.log.info("batch %s: the store is back after %.1fs", self.group_id, lasted)
                if driver is None:
                    await self._show_logs(backend, reports)
                done = {j: r for j, r in reports.items() if r.status.is_terminal}
                self._status_line(line, reports, done)
                await self._show_progress()
                if driver is not None and self._batch.finished:
                    await self._driver_work(driver.save, self._batch)
                    if (ended := await self._end_task(backend)) is not None:
                        yield ended  # no hold: it ends the task (``triggers.end_task``)
                        return
                    await hold(self.not_before)
                    yield TriggerEvent(finished_event(self._batch))
                    return
                if driver is None and (done or not self.handles):
                    if remaining(self.not_before) > 0:
                        # Too soon after the deferral: poll again once it has settled,
                        # gathering whatever else finishes meanwhile.
                        await asyncio.sleep(min(remaining(self.not_before), self.poll_interval))
                        continue
                    yield TriggerEvent(self._changed_event(done))
                    return
                if self.deadline is not None and time.time() >= self.deadline:
                    yield TriggerEvent(
                        {
                            "status": "timeout",
                            "state": self._event_state(),
                            "group_id": self.group_id,
                            "message": "the task's execution deadline passed",
                        }
                    )
                    return
                await backend.await_change(self.handles, next(delays))
        except asyncio.CancelledError:
            # The triggerer is stopping (or the task left the deferral): what this
            # trigger launched and showed so far is saved, so the next triggerer
            # continues from here instead of showing lines again.
            # The driver's work in flight is waited for first (a save beside a step
            # could catch an input between queue and active), through further cancels.
            # When the loop itself is torn down (a triggerer stopping), the work's task
            # is cancelled too and reads as ended while its thread still runs: the
            # save then waits for the step in the driver (``BatchDriver.busy``).
            if driver is not None:
                driver.halt.set()
            if self._work is not None:
                await to_the_end(self._work)
            if driver is not None:
                await to_the_end(asyncio.ensure_future(asyncio.to_thread(driver.save, self._batch)))
            raise
        except Exception as exc:  # noqa: BLE001 - never let run() die without an event
            self.log.exception("kinetic batch trigger for %s failed", self.group_id)
            await hold(self.not_before)
            yield TriggerEvent(
                {
                    "status": "error",
                    "state": self._event_state(),
                    "message": f"{type(exc).__name__}: {exc}",
                }
            )

    def _ends_task(self) -> bool:
        """Whether this trigger may end its task itself: the operator said so, and it
        does not run in the deferring process (``dag.test()``)."""
        return self.end_task is not None and not deferred_here(self.not_before)

    async def _ended_before(self) -> TriggerEvent | None:
        """A trigger of this try already ended the task and its event was lost: the
        same XComs again, from the task's record (``end_task.handed_before``)."""
        if not self._ends_task():
            return None
        from airflow.triggers.base import TaskSuccessEvent

        from airflow_provider_kinetic.triggers.end_batch import store_and_secret
        from airflow_provider_kinetic.triggers.end_task import EndTask, handed_before

        end = EndTask.from_dict(self.end_task or {})
        store, secret = await asyncio.to_thread(store_and_secret, self.config)
        if await in_sdk_thread(handed_before, store, secret, self.group_id, end) is None:
            return None
        self.log.info("batch %s: ended the task before; ending it again", self.group_id)
        return TaskSuccessEvent()

    async def _end_task(self, backend: Any) -> TriggerEvent | None:
        """Finish the batch here and end the task with its values
        (``triggers.end_batch``), or None: a worker finishes it (the reason is logged)."""
        if not self._ends_task():
            return None
        from airflow.triggers.base import TaskSuccessEvent

        from airflow_provider_kinetic.triggers.end_batch import finish_batch_here, store_and_secret
        from airflow_provider_kinetic.triggers.end_task import EndTask, NotHere, handed_before

        end = EndTask.from_dict(self.end_task or {})
        store, secret = await asyncio.to_thread(store_and_secret, self.config)
        try:
            await in_sdk_thread(
                finish_batch_here, store, backend, secret, self._batch, end, self.log
            )
        except NotHere as exc:
            self.log.info("batch %s: a worker finishes the task (%s)", self.group_id, exc)
            return None
        except Exception:  # noqa: BLE001 - the record says whether the values were handed
            self.log.exception("batch %s: finishing it in the trigger failed", self.group_id)
            if await in_sdk_thread(handed_before, store, secret, self.group_id, end) is None:
                return None
        self.log.info("batch %s: the trigger ends the task with its values", self.group_id)
        return TaskSuccessEvent()

    async def _driver_work(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn`` in a thread (the store and cluster clients are synchronous), kept in
        ``_work``: a cancel does not stop a thread, so the cancel's save waits for it."""
        self._work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        return await asyncio.shield(self._work)

    def _sync_state(self) -> None:
        """The handles polled, after the driver changed the batch."""
        self.handles = list(self._batch.active.values())

    def _event_state(self) -> dict[str, Any]:
        """The state an event carries: a driven batch's as it is now (serialised once,
        at the event, not at every poll), else the deferral's with its log offsets."""
        return self._batch.to_dict() if self.drive else self.state

    def _status_line(self, line: batchlogs.StatusLine, reports: dict[str, Any], done: dict) -> None:
        """The batch's counts, when one changed (else once a minute)."""
        running = sum(r.status.value == "RUNNING" for r in reports.values())
        waiting = sum(r.message.startswith("queued:") for r in reports.values())
        counts = (
            len(reports),
            running,
            len(reports) - running - len(done),
            waiting,
            len(done),
            len(self._batch.queue),
            len(self._batch.done),
        )
        if not line.due(counts):
            return
        self.log.info(
            "batch %s: %d active (%d running, %d pending, of which %d waiting for a "
            "local job slot, %d just finished), %d queued, %d done of %d",
            self.group_id,
            *counts,
            self._batch.total,
        )

    async def _show_progress(self) -> None:
        """The batch's progress line when it changed (``core.batch.progress``: its
        running children's reports, store reads every ``READ_EVERY_S``)."""
        try:
            if self._progress is None:
                from airflow_provider_kinetic.core.batch.progress import BatchProgress
                from airflow_provider_kinetic.deployment.connection import config_from_json
                from airflow_provider_kinetic.gcp.gcs_auth import store_for

                store = await asyncio.to_thread(store_for, config_from_json(self.config))
                self._progress = (BatchProgress(), store)
            watch, store = self._progress
            said = await asyncio.to_thread(watch.poll, self._batch, store, False)
        except Exception as exc:  # noqa: BLE001 - progress never fails the batch's wait
            self.log.debug("batch %s: no progress: %s", self.group_id, exc)
            return
        if said:
            self.log.info("batch %s: %s", self.group_id, said)

    def _changed_event(self, done: dict[str, Any]) -> dict[str, Any]:
        return {
            "status": "changed",
            "state": self._event_state(),
            "finished": {
                j: {"status": r.status.value, "reason": r.reason, "message": r.message}
                for j, r in done.items()
            },
        }

    async def _show_logs(self, backend: Any, reports: dict[str, Any]) -> None:
        """Running children's new lines into the task log; the offsets into the state
        the event carries back (finished children are drained by the operator)."""
        if not self.log_bytes_per_poll:
            return
        lines: list[tuple[int, str, int | None]] = []
        capped = _CappedReads(backend, self.log_bytes_per_poll)
        await batchlogs.ashow(
            self._batch,
            capped,  # type: ignore[arg-type]  # ashow only reads logs through it
            reports,
            lambda index, line, ns: lines.append((index, line, ns)),
            self.log_bytes_per_poll,
            drain=self.drive,
        )
        if not self.drive:  # a driven batch's offsets are in ``_batch`` already
            self.state = {**self.state, **batchlogs.wire(self._batch)}
        async for index, line, ns in yielding(lines):
            info_at(self.log, ns, "[child %d] %s", index, line)

    async def on_kill(self) -> None:
        """Airflow 3.3+: user mark-failed/clear cancels every active child."""
        if not self.cancel_on_kill:
            return
        from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
        from airflow_provider_kinetic.deployment.connection import config_from_json

        backend = await asyncio.to_thread(self._backend)
        from airflow_provider_kinetic.gcp.gcs_auth import store_for

        store = store_for(config_from_json(self.config))
        handles = list(self._batch.active.values())
        self.log.info(
            "task killed by user: cancelling %d children of batch %s",
            len(handles),
            self.group_id,
        )
        for handle in handles:  # markers first: a new try never adopts these
            await asyncio.to_thread(request_cancel, store, backend, handle)
        from airflow_provider_kinetic.core.batch.finish import batch_cancelled

        await asyncio.to_thread(batch_cancelled, self._batch, store, "task killed")
