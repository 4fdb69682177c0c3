"""Shared status reads for the triggers of one process: one list per cluster and namespace.

A deferred job's trigger used to read its Job and list its pods every poll, so a
triggerer holding a thousand jobs sent a thousand reads per interval to one API
server.  Here the triggers of one event loop (Airflow's TriggerRunner runs them all
on one) subscribe to a :class:`Reader` per (backend kind, connection, namespace):
when a subscriber's next poll is due, the reader lists every kinetic Job (or
LeaderWorkerSet) and pod of the namespace by :data:`SELECTOR` (a label every
kinetic job and pod carries, ``core.spec.pod``) and answers every subscriber that is
due from that one snapshot (``StatusReads._listed_plan``: the same diagnosis as a
single read; a job missing from the list is read on its own first, so it is never
called NOT_FOUND from a list).  At most one list per reader per ``interval`` (the
shortest poll interval of its subscribers).

Triggers stay independent: a cancelled trigger leaves (``subscribe`` is a context
manager) without touching the others' waits; a failed list (after the API retries,
``k8s/retry.py``) fails only that tick's waits with :class:`SharedReadFailed`, and a
subscriber then reads on its own; a reader that dies does the same for all its
waits and the next subscription forms a new one.  Nothing is persisted: a
triggerer restart re-creates the triggers from their kwargs and they form new
readers.  Live log reads are granted per tick from one :class:`LogBudget`.

Time comes from a :class:`Clock`, so a benchmark can run minutes of polls in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends.log_budget import LogBudget
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport

#: Every kinetic Job, LeaderWorkerSet and pod has a ``job-id`` label (kinetic's own too).
SELECTOR = "job-id"
#: A waiter due within this part of the interval after a list is answered by it (a
#: poll a little early beats one a whole interval late).
EARLY_FRACTION = 0.5


class SharedReadFailed(KineticError):
    """No shared answer this time (the list failed, or the reader is gone): read on your own."""


class Clock:
    """Real time (``time.monotonic``); a benchmark's fake clock overrides both methods."""

    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float, settled: Callable[[], bool]) -> None:
        """Until ``event`` is set or ``timeout`` seconds passed.  ``settled()`` says
        whether every subscriber is waiting (a fake clock advances only then)."""
        if timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


@dataclass(frozen=True)
class Seen:
    """A subscriber's answer: its job's report from the list taken at ``at`` (clock
    time), the pod its log is read from (``listed``: known from the list), and the
    byte cap of the live log read granted to it this tick (``None``: none)."""

    report: StatusReport
    at: float
    log_pod: dict[str, Any] | None = None
    listed: bool = False
    log_cap: int | None = None


@dataclass(eq=False)
class _Waiter:
    handle: JobHandle
    due: float
    log_bytes: int | None
    future: asyncio.Future[Seen] = field(repr=False)


class Reader:
    """One list loop for the subscribers of one (kind, connection, namespace)."""

    def __init__(self, reads: SharedReads, key: Hashable, backend: Any, namespace: str):
        self.reads, self.key, self.backend, self.namespace = reads, key, backend, namespace
        self.subscribers: dict[Hashable, float] = {}  # token -> its poll interval
        self.waiters: dict[Hashable, _Waiter] = {}
        self.changed = asyncio.Event()
        self.last = -math.inf
        #: one API client for the reader's lists and its subscribers' log reads, kept
        #: open while it runs (``PlanDriver._arun``'s ``shared``: [current, every one
        #: made]): the same connection and so the same credentials, by the key
        self.client: list[Any] = [None]
        #: lists sent (tests and the benchmark count them too, at the API double)
        self.lists = 0
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"kinetic {key}")
        self.task.add_done_callback(self._ended)

    @property
    def interval(self) -> float:
        return min(self.subscribers.values(), default=5.0)

    @property
    def alive(self) -> bool:
        return not self.task.done()

    def _settled(self) -> bool:
        return len(self.waiters) >= len(self.subscribers)

    async def _run(self) -> None:
        try:
            await self._loop()
        finally:
            made, self.client[:] = self.client[1:], [None]
            for client in made:
                await client.close()

    async def _loop(self) -> None:
        while self.subscribers:
            self.changed.clear()
            if not self.waiters:
                await self.changed.wait()
                continue
            target = max(min(w.due for w in self.waiters.values()), self.last + self.interval)
            clock = self.reads.clock
            await clock.wait(self.changed, max(0.0, target - clock.now()), self._settled)
            if clock.now() >= target and self.waiters:
                await self._tick(clock.now())

    async def _tick(self, now: float) -> None:
        horizon = now + EARLY_FRACTION * self.interval
        # Answered ones leave at once: a waiter still listed is one still waiting.
        due = {t: w for t, w in self.waiters.items() if w.due <= horizon}
        for token in due:
            del self.waiters[token]
        self.last = now
        self.lists += 1
        try:
            found = await self.backend.alisted(
                self.namespace, SELECTOR, [w.handle for w in due.values()], self.client
            )
        except Exception as exc:  # noqa: BLE001 - every waiter falls back to its own read
            for waiter in due.values():
                _fail(waiter, f"the shared list of {self.namespace} failed: {exc}")
            return
        wanting = []
        for token, waiter in due.items():
            seen = found.get(waiter.handle.job_id)
            if seen is None or seen.report is None or seen.report.status.is_terminal:
                continue  # a finished job's log is drained in full, outside the budget
            if waiter.log_bytes and seen.listed and _started(seen.log_pod):
                wanting.append((token, waiter.log_bytes))
        caps = self.reads.budget.grant(wanting, now)
        for token, waiter in due.items():
            seen = found.get(waiter.handle.job_id)
            if seen is None or seen.report is None:
                why = seen.error if seen is not None else "not answered"
                _fail(waiter, f"no shared answer for {waiter.handle.job_id}: {why}")
                continue
            answer = Seen(seen.report, now, seen.log_pod, seen.listed, caps.get(token))
            if not waiter.future.done():
                waiter.future.set_result(answer)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """However the loop ended, nobody waits for it any more."""
        for waiter in self.waiters.values():
            _fail(waiter, "the shared reader stopped")
        if self.reads.readers.get(self.key) is self:
            del self.reads.readers[self.key]
        if not task.cancelled() and task.exception() is not None:
            self.reads.died.append(task.exception())


def _fail(waiter: _Waiter, why: str) -> None:
    if not waiter.future.done():
        waiter.future.set_exception(SharedReadFailed(why))


def _started(pod: dict[str, Any] | None) -> bool:
    """Whether a pod's log can be read (a pending pod's container has no log yet)."""
    return pod is not None and (pod.get("status") or {}).get("phase") not in (None, "Pending")


class Subscription:
    """One trigger's place in a reader: :meth:`next` is its next poll's answer."""

    def __init__(
        self, reads: SharedReads, key: Hashable, backend: Any, handle: JobHandle, interval: float
    ):
        self.reads, self.key, self.backend, self.handle = reads, key, backend, handle
        self.interval = interval
        self.token = object()
        self.reader = reads._join(self)

    async def next(self, due: float, log_bytes: int | None = None) -> Seen:
        """The answer of the first list at or after ``due`` (clock time), with a live
        log read's cap when ``log_bytes`` (the read's size) is granted."""
        if not self.reader.alive:  # a new reader for the next polls; this one on its own
            self.reader = self.reads._join(self)
            raise SharedReadFailed("the shared reader stopped")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(self.handle, due, log_bytes, loop.create_future())
        self.reader.waiters[self.token] = waiter
        self.reader.changed.set()
        try:
            return await waiter.future
        finally:
            self.reader.waiters.pop(self.token, None)

    def spend(self, calls: int, nbytes: int) -> None:
        """Log reads made outside the grants (a finished job's drain)."""
        self.reads.budget.spend(calls, nbytes, self.reads.clock.now())

    def close(self) -> None:
        self.reads._leave(self)


class SharedReads:
    """The readers of one event loop (:func:`registry`), and their log budget."""

    def __init__(self, clock: Clock | None = None, budget: LogBudget | None = None):
        self.clock = clock or Clock()
        self.budget = budget or LogBudget()
        self.readers: dict[Hashable, Reader] = {}
        #: exceptions that ended a reader (a bug: its subscribers read on their own)
        self.died: list[BaseException] = []

    @contextlib.asynccontextmanager
    async def subscribe(
        self, key: Hashable, backend: Any, handle: JobHandle, interval: float
    ) -> AsyncIterator[Subscription]:
        """Share the reads of ``key`` (kind, connection, namespace) while inside."""
        sub = Subscription(self, key, backend, handle, interval)
        try:
            yield sub
        finally:
            sub.close()

    def _join(self, sub: Subscription) -> Reader:
        reader = self.readers.get(sub.key)
        if reader is None or not reader.alive:
            namespace = sub.backend.where(sub.handle)[0]
            reader = self.readers[sub.key] = Reader(self, sub.key, sub.backend, namespace)
        reader.subscribers[sub.token] = sub.interval
        reader.changed.set()
        self.budget.join(sub.token)
        self.budget.window_s = min(sub.interval, self.budget.window_s)
        return reader

    def _leave(self, sub: Subscription) -> None:
        reader = sub.reader
        reader.subscribers.pop(sub.token, None)
        reader.waiters.pop(sub.token, None)
        self.budget.leave(sub.token)
        if not reader.subscribers:  # the last one: the reader stops and a newcomer starts anew
            if self.readers.get(sub.key) is reader:
                del self.readers[sub.key]
            reader.task.cancel()
        else:
            reader.changed.set()


_REGISTRIES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedReads] = (
    weakref.WeakKeyDictionary()
)


def registry() -> SharedReads:
    """The shared reads of the running event loop (made on first use: asyncio objects
    belong to one loop, and a triggerer runs all its triggers on one)."""
    loop = asyncio.get_running_loop()
    found = _REGISTRIES.get(loop)
    if found is None:
        found = _REGISTRIES[loop] = SharedReads()
    return found


def install(reads: SharedReads) -> None:
    """Use ``reads`` for the running loop (a benchmark's fake clock, a test's budget)."""
    _REGISTRIES[asyncio.get_running_loop()] = reads
