"""The job trigger follows a chatty job without holding the triggerer's event loop.

A real local job prints ~18 MB (half, then the rest once the trigger has shown some
of it, so both the running polls and the final drain are exercised); the real
``KineticJobTrigger.run()`` follows it on an asyncio loop beside a heartbeat that
ticks every 10 ms.  Every other trigger on a triggerer waits as long as the loop's
thread works between two ticks: that CPU time is measured (``time.thread_time``),
not the wall-clock gap, which on a busy machine also counts the time the OS gave
other processes (0.19 s seen once in the full suite on 2 CPUs).  The same for
``KineticBatchTrigger`` and a chatty child.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from airflow_provider_kinetic.core.backends.local import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from airflow_provider_kinetic.triggers.job import KineticJobTrigger
from tests.fixtures import records

LINES = 300_000  # 62 bytes each: 18.6 MB
#: Lines the trigger shows before the job may print its second half.
RELEASE_AFTER = 20_000
TICK_S = 0.01
MAX_GAP_S = 0.1


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
        time.sleep(0.01)
    sys.stdout.write(block(lines // 2, lines))
    sys.stdout.flush()
    return lines


class Lines(logging.Handler):
    """The job's lines as the trigger wrote them into the task log; touches
    ``release`` once ``RELEASE_AFTER`` of them were shown (the job is still running)."""

    def __init__(self, prefix: str, release: Path):
        super().__init__()
        self.prefix = prefix
        self.release_file = release
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(self.prefix):
            self.lines.append(message[len(self.prefix) :])
            if len(self.lines) == RELEASE_AFTER:
                self.release_file.touch()


def _listen(trigger: KineticJobTrigger | KineticBatchTrigger, handler: Lines) -> None:
    trigger._log = logging.getLogger(f"kinetic.test.trigger.{id(trigger)}")
    trigger._log.propagate = False
    trigger._log.addHandler(handler)


async def _follow(trigger: KineticJobTrigger | KineticBatchTrigger) -> tuple[list, list[float]]:
    gaps: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        last = time.thread_time()  # the loop thread's CPU: what it held the loop for
        while not done.is_set():
            await asyncio.sleep(TICK_S)
            now = time.thread_time()
            gaps.append(now - last)
            last = now

    async def follow() -> list:
        try:
            return [event async for event in trigger.run()]
        finally:
            done.set()

    events, _ = await asyncio.gather(follow(), heartbeat())
    return events, gaps


def test_trigger_shows_an_18_mb_log_in_bounded_polls_without_holding_the_loop(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path
):
    release = tmp_path / "release"
    handle, _ = submit_job(JobRequest(func=chatty, args=(str(release), LINES)), config, backend)
    trigger = KineticJobTrigger(
        handle.to_dict(), config_to_json(config), poll_interval=0.05, not_before=0
    )
    handler = Lines(f"[{handle.job_id}] ", release)
    _listen(trigger, handler)
    try:
        events, gaps = asyncio.run(_follow(trigger))
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
    print(f"largest event-loop gap: {max(gaps):.3f}s over {len(gaps)} ticks")
    assert max(gaps) < MAX_GAP_S, f"the loop was held for {max(gaps):.3f}s"


def test_batch_trigger_shows_a_chatty_childs_log_without_holding_the_loop(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path
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
        events, gaps = asyncio.run(_follow(trigger))
    finally:
        trigger._log.removeHandler(handler)

    (event,) = [e.payload for e in events]
    assert event["finished"][handle.job_id]["status"] == "SUCCEEDED"
    job_id, offset = event["state"]["log_offsets"]["0"]
    log = Path(backend.job_dir(handle.job_id), "log").read_bytes()
    # The lines shown are the log up to the offset the operator continues from, once each.
    assert job_id == handle.job_id and handler.lines == log[:offset].decode().splitlines()
    assert release.exists() and len(handler.lines) >= RELEASE_AFTER
    print(f"largest event-loop gap (batch): {max(gaps):.3f}s over {len(gaps)} ticks")
    assert max(gaps) < MAX_GAP_S, f"the loop was held for {max(gaps):.3f}s"
