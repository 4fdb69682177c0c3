"""One triggerer, many deferred GKE jobs (issue 23, item 1): API calls per minute and memory.

The real ``KineticJobTrigger``s (each with its own ``GkeBackend``, as the triggerer
builds one per trigger) run on one event loop, as Airflow's TriggerRunner runs them,
against the Kubernetes API double (``tests/fixtures/k8s_double.py``, real clients over
HTTP).  Every job runs for the whole minute and prints a line per interval.  Time is
fake (``tests/fixtures/triggerer.FakeClock``): it moves on by the poll interval when
every trigger waits, so a minute of polls takes seconds; every request the triggers
send in the first minute is counted at the double.

Goals: calls per minute at 1,000 jobs at most 2x those at 10 (shared reads: one list
of Jobs and one of pods per interval, plus the log budget's reads); memory per
deferred job under 100 KB (tracemalloc's traced memory while 1,000 triggers wait,
less what was traced before they were made, over 1,000; the double's own objects
were made before).  Before: each trigger read its Job and listed its pods every poll
and read its log (a pod list and a log read), measured here with sharing off.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import tracemalloc
from collections import Counter
from typing import Any

from table import Row

POLL_S = 5.0
MINUTE_S = 60.0
GOAL_GROWTH = 2.0
GOAL_KB_PER_JOB = 100.0
QUIET = logging.getLogger("kinetic.bench.triggers")
QUIET.setLevel(logging.WARNING)
QUIET.propagate = False


class Sleepers:
    """Per-job polling's waits on the fake clock: it moves to the earliest due wait
    when every live trigger waits (the baseline: no shared reader)."""

    def __init__(self, clock: Any, alive: int) -> None:
        self.clock, self.alive = clock, alive
        self._waits: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waits, (self.clock.t + seconds, next(self._seq), fut))
        if len(self._waits) >= self.alive:
            self.clock.t = self._waits[0][0]
            for hook in self.clock.on_move:
                hook(self.clock.t)
            while self._waits and self._waits[0][0] <= self.clock.t:
                heapq.heappop(self._waits)[2].set_result(None)
        await fut


async def _jobs(api: Any, n: int) -> list[Any]:
    from tests.fixtures.triggerer import add_running_job

    handles: list[Any] = []
    for start in range(0, n, 50):  # a few at a time; forget the set-up's requests as we go
        batch = range(start, min(n, start + 50))
        handles += await asyncio.gather(*(add_running_job(api, f"job-{i:06d}") for i in batch))
        api.forget_requests()
    return handles


async def drive(n: int, shared: bool, memory: bool = False) -> dict[str, Any]:
    """Requests of the first fake minute by kind, and the traced bytes per trigger."""
    from airflow_provider_kinetic.core.backends import shared_reads
    from airflow_provider_kinetic.core.backends.k8s.manifests import job_name
    from tests.fixtures.k8s_double import by_code_under_test, forget_log_cursors, running_double
    from tests.fixtures.triggerer import FakeClock, backend_for, first_event, trigger_for

    forget_log_cursors()
    async with running_double() as api:
        handles = await _jobs(api, n)
        clock = FakeClock(expect=n if shared else 0)
        shared_reads.install(shared_reads.SharedReads(clock))
        sleepers = Sleepers(clock, n)
        kinds: Counter[str] = Counter()
        minute = asyncio.Event()
        traced: list[int] = []
        base = 0

        def tick(t: float) -> None:  # settled: nothing in flight
            kinds.update(_kind(r) for r in by_code_under_test(api.requests))
            api.forget_requests()
            if memory and t >= MINUTE_S / 2 and not traced:
                traced.append(tracemalloc.get_traced_memory()[0] - base)
            if t >= MINUTE_S:
                minute.set()
            for h in handles:  # every job prints a line per interval
                api.write_log("default", f"{job_name(h.job_id)}-p", f"{h.job_id} at {t:g}")

        tick(0.0)
        kinds.clear()
        clock.on_move.append(tick)
        if memory:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        triggers = []
        for h in handles:
            backend = backend_for(api)
            if not shared:
                backend.alisted = None  # type: ignore[attr-defined]  # per-job reads
                backend.await_change = lambda _h, s: sleepers.sleep(s)  # type: ignore[method-assign]
            trigger = trigger_for(h, backend, poll_interval=POLL_S)
            trigger._log = QUIET  # shown lines are not what is measured
            triggers.append(trigger)
        tasks = [asyncio.create_task(first_event(t)) for t in triggers]
        try:
            await minute.wait()
        finally:
            if memory:
                tracemalloc.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return {"kinds": kinds, "per_job": traced[0] / n if traced else None}


def _kind(request: Any) -> str:
    path = request.url.path
    if path.endswith("/log"):
        return "log reads"
    selector = request.params.get("labelSelector", "")
    what = "job" if "/jobs" in path else "pod" if path.endswith("/pods") else path
    return f"{what} lists" if selector == "job-id" else f"{what} reads ({selector or 'one'})"


def _run(n: int, shared: bool, memory: bool = False) -> dict[str, Any]:
    return asyncio.run(drive(n, shared, memory))


def triggerer(sizes: tuple[int, ...], before: tuple[int, ...]) -> list[Row]:
    """The rows: calls/min from ``sizes[0]`` to ``sizes[-1]`` jobs, memory per job at
    ``sizes[-1]``; per-job polling (before) measured at ``before``."""
    try:
        import kmock  # noqa: F401 - the API double's server (a dev dependency)
    except ImportError:
        why = "kmock (the API double) is not installed"
        return [Row.skipped(_case(sizes), why), Row.skipped(_mem_case(sizes), why)]
    quiet = [logging.getLogger(n) for n in ("aiohttp.access", "airflow_provider_kinetic")]
    levels = [q.level for q in quiet]
    for q in quiet:  # a line per request and per shown log line would bury the table
        q.setLevel(logging.WARNING)
    try:
        started = time.perf_counter()
        shared = {n: _run(n, True, memory=n == sizes[-1]) for n in sizes}
        old = {n: _run(n, False) for n in before}
        took = time.perf_counter() - started
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
    rate = {n: sum(r["kinds"].values()) * 60.0 / MINUTE_S for n, r in shared.items()}
    old_rate = {n: sum(r["kinds"].values()) * 60.0 / MINUTE_S for n, r in old.items()}
    small, large = sizes[0], sizes[-1]
    growth = rate[large] / rate[small]
    curve = ", ".join(f"{n:,}: {rate[n]:g}" for n in sizes)
    before_s = ", ".join(f"{n:,}: {old_rate[n]:g}" for n in before)
    kinds = ", ".join(f"{k} {v:g}" for k, v in sorted(shared[large]["kinds"].items()))
    calls = Row(
        _case(sizes),
        f"{small:,} jobs: {rate[small]:g}/min",
        f"{large:,} jobs: {rate[large]:g}/min",
        None,
        f"<= {GOAL_GROWTH:g}x of {small:,} jobs",
        growth <= GOAL_GROWTH,
        f"x{growth:.2f}; calls/min {curve}; at {large:,}: {kinds}; per-job polling "
        f"(before) {before_s}; the real triggers against the API double, one fake "
        f"minute each at poll_interval {POLL_S:g} s ({took:.0f} s wall in all)",
    )
    per_job = shared[large]["per_job"] / 1024
    memory = Row(
        _mem_case(sizes),
        "-",
        f"{per_job:.1f} KB/job",
        None,
        f"< {GOAL_KB_PER_JOB:g} KB/job",
        per_job < GOAL_KB_PER_JOB,
        f"tracemalloc: traced memory {MINUTE_S / 2:g} fake seconds in, less before the "
        f"triggers were made, over {large:,} (the trigger, its backend and client, its "
        "task, its share of the reader's snapshot)",
    )
    return [calls, memory]


def _case(sizes: tuple[int, ...]) -> str:
    return f"triggerer API calls/min, {sizes[0]:,} -> {sizes[-1]:,} deferred GKE jobs"


def _mem_case(sizes: tuple[int, ...]) -> str:
    return f"triggerer memory per deferred GKE job, {sizes[-1]:,} jobs"
