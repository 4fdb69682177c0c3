"""The job trigger follows a chatty job without holding the triggerer's event loop.

A real local job prints ~18 MB (half, then the rest once the trigger has shown some
of it, so both the running polls and the final drain are exercised); the real
``KineticJobTrigger.run()`` follows it on an asyncio loop.  Every other trigger on a
triggerer waits while the loop's thread works, so the trigger must keep its work on
the loop small, which is checked by what it does rather than by timing it (a timing
counts whatever else the machine runs):

* every status and log read (the file I/O) runs in a thread other than the loop's;
* every log read is capped at the trigger's ``log_bytes_per_poll``;
* the lines are written into the task log in slices, the loop turning between two:
  ``yielding`` lets it run every ``YIELD_EVERY_S`` of its clock, here a clock that
  moves on ``STEP_S`` a reading, so a slice is ``LINES_PER_TURN`` lines on any machine
  (a poll's worth, thousands, if the trigger wrote its lines without yielding).

The same for ``KineticBatchTrigger`` and a chatty child.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers import job as job_trigger
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from airflow_provider_kinetic.triggers.job import YIELD_EVERY_S, KineticJobTrigger
from tests.fixtures import records
from tests.fixtures.waiting import wait_for, wait_for_async

LINES = 300_000  # 62 bytes each: 18.6 MB
#: Lines the trigger shows before the job may print its second half.
RELEASE_AFTER = 20_000
#: Lines ``yielding`` writes before the loop turns, with the clock below.
LINES_PER_TURN = 100
STEP_S = YIELD_EVERY_S / LINES_PER_TURN


def job_line(i: int) -> str:
    return f"line {i:07d} " + "x" * 48


def chatty(release: str, lines: int) -> int:
    """Prints half its lines, waits for ``release``, prints the rest (one write each)."""
    import os
    import sys
    import time

    def block(start: int, stop: int) -> str:
        return "".join(f"line {i:07d} " + "x" * 48 + "\n" for i in range(start, stop))

    sys.stdout.write(block(0, lines // 2))
    sys.stdout.flush()
    while not os.path.exists(release):
        time.sleep(0.01)  # timing-ok: the job's workload polls the test's release file
    sys.stdout.write(block(lines // 2, lines))
    sys.stdout.flush()
    return lines


class Lines(logging.Handler):
    """The job's lines as the trigger wrote them into the task log; touches
    ``release`` once ``RELEASE_AFTER`` of them were shown (the job is still running).
    ``shown`` is set by each line, for the loop watcher of ``_follow``."""

    def __init__(self, prefix: str, release: Path):
        super().__init__()
        self.prefix = prefix
        self.release_file = release
        self.lines: list[str] = []
        self.shown: asyncio.Event | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(self.prefix):
            self.lines.append(message[len(self.prefix) :])
            if self.shown is not None:
                self.shown.set()  # on the loop's thread: the trigger writes from its coroutine
            if len(self.lines) == RELEASE_AFTER:
                self.release_file.touch()


class SliceClock:
    """``triggers.job``'s clock: each reading moves it on ``STEP_S``."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += STEP_S
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Reads:
    """The threads the backend's status and log reads ran in, and each log read's cap."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.caps: list[int | None] = []


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    seen = Reads()

    def recorded(name: str) -> None:
        real = getattr(LocalBackend, name)

        def read(self: LocalBackend, *args: Any, **kwargs: Any) -> Any:
            seen.threads.add(threading.get_ident())
            if name == "read_logs":
                seen.caps.append(kwargs.get("max_bytes", args[2] if len(args) > 2 else None))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(LocalBackend, name, read)

    for name in ("status", "batch_status", "read_logs"):
        recorded(name)
    monkeypatch.setattr(job_trigger, "time", SliceClock())
    return seen


def _listen(trigger: KineticJobTrigger | KineticBatchTrigger, handler: Lines) -> None:
    trigger._log = logging.getLogger(f"kinetic.test.trigger.{id(trigger)}")
    trigger._log.propagate = False
    trigger._log.addHandler(handler)


async def _follow(
    trigger: KineticJobTrigger | KineticBatchTrigger, handler: Lines
) -> tuple[list, list[int], int]:
    """The trigger's events; how many lines it wrote between two turns of the loop (a
    watcher task wakes at the first turn after a line); the loop's thread."""
    turns: list[int] = []
    done = asyncio.Event()
    handler.shown = asyncio.Event()

    async def watcher() -> None:
        counted = 0
        while not done.is_set():
            await handler.shown.wait()
            handler.shown.clear()
            turns.append(len(handler.lines) - counted)
            counted = len(handler.lines)

    async def follow() -> list:
        try:
            return [event async for event in trigger.run()]
        finally:
            done.set()
            handler.shown.set()

    events, _ = await asyncio.gather(follow(), watcher())
    return events, turns, threading.get_ident()


def assert_light_on_the_loop(reads: Reads, turns: list[int], loop: int, cap: int) -> None:
    assert reads.threads and loop not in reads.threads, "a status or log read on the loop"
    assert reads.caps and all(c is not None and c <= cap for c in reads.caps), reads.caps
    assert sum(turns) > 10 * LINES_PER_TURN  # many slices were written ...
    # ... none longer than one (give or take a line at a slice's edge)
    assert max(turns) <= LINES_PER_TURN + 2, f"{max(turns)} lines with no turn of the loop"


def test_trigger_shows_an_18_mb_log_in_bounded_polls_without_holding_the_loop(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path, reads: Reads
):
    release = tmp_path / "release"
    handle, _ = submit_job(JobRequest(func=chatty, args=(str(release), LINES)), config, backend)
    trigger = KineticJobTrigger(
        handle.to_dict(), config_to_json(config), poll_interval=0.05, not_before=0
    )
    handler = Lines(f"[{handle.job_id}] ", release)
    _listen(trigger, handler)
    try:
        events, turns, loop = asyncio.run(_follow(trigger, handler))
    finally:
        trigger._log.removeHandler(handler)

    assert [e.payload["status"] for e in events] == ["SUCCEEDED"]
    log = Path(backend.job_dir(handle.job_id), "log").read_bytes()
    assert events[0].payload["log_offset"] == len(log)
    # Every line of the job's log once, in order (the runner's own lines included) ...
    assert handler.lines == log.decode().splitlines()
    assert [x for x in handler.lines if x.startswith("line ")] == [
        job_line(i) for i in range(LINES)
    ]
    # ... some while the job ran (it waited for them), the rest once it had ended ...
    assert release.exists() and len(log) > 18_000_000
    # ... while the loop kept running everything else.
    assert_light_on_the_loop(reads, turns, loop, trigger.log_bytes_per_poll)


def test_batch_trigger_shows_a_chatty_childs_log_without_holding_the_loop(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path, reads: Reads
):
    """Running polls show ``log_bytes_per_poll`` of the child each; when it ends the
    event comes without its whole log being shown on the loop first: the offset in
    the state says where the operator continues."""
    release = tmp_path / "release"
    handle, _ = submit_job(JobRequest(func=chatty, args=(str(release), LINES)), config, backend)
    state = records.batch_state(1, {0: handle.job_id}, root=config.bucket_name)
    trigger = KineticBatchTrigger(
        state=state.to_dict(), config=config_to_json(config), poll_interval=0.05, not_before=0
    )
    handler = Lines("[child 0] ", release)
    _listen(trigger, handler)
    try:
        events, turns, loop = asyncio.run(_follow(trigger, handler))
    finally:
        trigger._log.removeHandler(handler)

    (event,) = [e.payload for e in events]
    assert event["finished"][handle.job_id]["status"] == "SUCCEEDED"
    job_id, offset = event["state"]["log_offsets"]["0"]
    log = Path(backend.job_dir(handle.job_id), "log").read_bytes()
    # The lines shown are the log up to the offset the operator continues from, once each.
    assert job_id == handle.job_id and handler.lines == log[:offset].decode().splitlines()
    assert release.exists() and len(handler.lines) >= RELEASE_AFTER
    assert_light_on_the_loop(reads, turns, loop, trigger.log_bytes_per_poll)


def test_a_trigger_re_created_from_its_kwargs_shows_no_line_again(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path
):
    """A triggerer restart: the trigger shows half the job's log, is stopped (cancelled,
    as a stopping triggerer does), and a new one is made from the kwargs Airflow stored
    at the deferral (the deferral's ``log_offset``).  It continues from where the first
    left the log (``core.jobs.logmark``): every line once across the two.  A later
    deferral of the same job (another try's task log) starts from its own offset."""
    release, half = tmp_path / "release", 500
    handle, _ = submit_job(JobRequest(func=chatty, args=(str(release), 2 * half)), config, backend)
    _, kwargs = KineticJobTrigger(
        handle.to_dict(), config_to_json(config), poll_interval=0.05
    ).serialize()
    prefix = f"[{handle.job_id}] "
    first, second = Lines(prefix, tmp_path / "unused"), Lines(prefix, tmp_path / "unused")

    async def restarted() -> list:
        old = KineticJobTrigger(**json.loads(json.dumps(kwargs)))
        _listen(old, first)
        running = asyncio.ensure_future(_events(old))
        await wait_for_async("the first half shown", lambda: job_line(half - 1) in first.lines)
        running.cancel()  # the triggerer stops
        with pytest.raises(asyncio.CancelledError):
            await running
        release.touch()
        new = KineticJobTrigger(**json.loads(json.dumps(kwargs)))
        _listen(new, second)
        return await _events(new)

    events = asyncio.run(restarted())
    assert [e.payload["status"] for e in events] == ["SUCCEEDED"]
    log = Path(backend.job_dir(handle.job_id), "log").read_bytes().decode().splitlines()
    assert first.lines + second.lines == log  # each line once, in order
    assert job_line(half - 1) in first.lines and job_line(half) in second.lines
    # Another deferral of the job (its own not_before) shows the log from its offset.
    again = KineticJobTrigger(**{**kwargs, "not_before": 0})
    third = Lines(prefix, tmp_path / "unused")
    _listen(again, third)
    asyncio.run(_events(again))
    assert third.lines == log


async def _events(trigger: KineticJobTrigger) -> list:
    return [event async for event in trigger.run()]


def two_stamped_lines() -> int:
    """Prints two lines, each with the time (ns) just before it was printed."""
    import time

    print(f"first {time.time_ns()}", flush=True)
    print(f"second {time.time_ns()}", flush=True)
    return 0


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("kind", ["job", "batch"])
def test_job_lines_keep_the_time_the_job_wrote_them(
    config: KineticConfig, backend: LocalBackend, kind: str
):
    """Lines a poll reads together keep their own times, not the poll's: both lines
    were written before the trigger was even made, and the task log says when."""
    handle, _ = submit_job(JobRequest(func=two_stamped_lines), config, backend)
    log = Path(backend.job_dir(handle.job_id), "log")
    wait_for("both lines", lambda: log.exists() and b"second " in log.read_bytes())
    made = time.time_ns()
    if kind == "job":
        trigger: Any = KineticJobTrigger(
            handle.to_dict(), config_to_json(config), poll_interval=0.05, not_before=0
        )
        prefix = f"[{handle.job_id}] "
    else:
        state = records.batch_state(1, {0: handle.job_id}, root=config.bucket_name)
        trigger = KineticBatchTrigger(
            state=state.to_dict(), config=config_to_json(config), poll_interval=0.05, not_before=0
        )
        prefix = "[child 0] "
    seen = Records()
    trigger._log = logging.getLogger(f"kinetic.test.trigger.{id(trigger)}")
    trigger._log.propagate, trigger._log.level = False, logging.INFO
    trigger._log.addHandler(seen)
    asyncio.run(_events(trigger))

    stamped = {}
    for record in seen.records:
        message = record.getMessage()
        if message.startswith(prefix) and message[len(prefix) :].startswith(("first ", "second ")):
            word, printed = message[len(prefix) :].split()
            stamped[word] = (int(printed), round(record.created * 1e9))
    (first_printed, first_at), (second_printed, second_at) = stamped["first"], stamped["second"]
    # Each line at the time it reached the log (after its print; a microsecond's
    # rounding of ``created``), in order, and before the trigger existed.
    assert first_printed - 1000 <= first_at <= second_at < made
    assert second_printed - 1000 <= second_at
