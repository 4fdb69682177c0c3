"""Live logs of a batch's children: new lines into the task log, each once, bounded.

Whoever drives a batch (the map operator in sync mode, the batch trigger while it is
deferred, the batch sensor) calls :func:`show` / :func:`ashow` once per poll.  Per
running child the offset already shown rides in ``BatchState.log_offsets``
(``index -> [job_id, offset]``), so nothing is shown twice and nothing is skipped
across polls, deferrals and processes.  Only children still active (or just
finished, until drained) have an entry, so the state stays bounded by
``max_concurrent``.

Each running child shows at most ``max_bytes`` per poll; the rest comes next poll.
A poll reads at most ``CHILDREN_PER_POLL`` children's logs (finished ones first,
then running ones in turn, ``BatchState.log_turn``), so a poll of a 1,000-child
batch still makes a bounded number of API calls; pending children have no log yet.
A child that has just finished is drained in full before the driver deletes its
Job (on GKE its pod log goes with it).  When a child fails, the last
``TAIL_LINES`` lines of its log are kept in ``BatchState.log_tails`` for the
batch's failure summary (for at most ``MAX_TAILS`` children, lines cut to
``TAIL_LINE_CHARS``, so the state stays small).

The backend contract's offsets are opaque (bytes for the local backend, lines for
pod logs), so capping a read cannot just count: :func:`take` works out from the
read itself which unit the offset moved in and verifies it, and when it cannot
(a log that was not valid UTF-8 and was decoded with replacements), it shows the
whole read rather than risk a gap or a repeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend, line_times, lines_within
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport

log = logging.getLogger(__name__)

#: Bytes of new log shown per running child per poll (the rest comes next poll).
LOG_BYTES_PER_POLL = 64 * 1024
#: Children whose logs one poll reads (each read is an API call or two on GKE).
CHILDREN_PER_POLL = 8
#: Lines of a failed child's log repeated in the failure summary.
TAIL_LINES = 20
#: Failed children whose tails are kept (the state travels through the triggerer).
MAX_TAILS = 10
TAIL_LINE_CHARS = 300
#: Seconds between repeats of an unchanged batch status line.
STATUS_EVERY_S = 60.0

#: ``emit(index, line, ns)``: one log line of child ``index`` into the task log, with
#: the time the child wrote it (ns since the epoch; None where the backend does not
#: know it: ``backends.base.TimedText``), for ``core.logat.info_at``.
Emit = Callable[[int, str, int | None], None]


def take(text: str, offset: int, new_offset: int, max_bytes: int | None) -> tuple[list[str], int]:
    """Whole lines of one read, at most ``max_bytes`` of them, and the offset after them.

    ``text`` is what ``read_logs(handle, offset)`` returned with ``new_offset``.  If
    the offset moved by the number of lines, it counts lines; if by the UTF-8 size
    of the text, bytes (identical cuts when every line is empty).  Anything else:
    all of it, uncapped.  A single line longer than the cap is still taken (cut for
    display by :func:`clip`), so every poll makes progress (``lines_within``: the
    one capping rule, which the backends' capped reads follow too).
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if max_bytes is None or max_bytes <= 0 or len(text.encode()) <= max_bytes:
        return lines, new_offset
    moved = new_offset - offset
    if moved == len(lines):
        unit = "lines"
    elif moved == len(text.encode()):
        unit = "bytes"
    else:
        return lines, new_offset
    count = lines_within(lines, max_bytes)
    size = sum(len(line.encode()) + 1 for line in lines[:count])
    return lines[:count], offset + (count if unit == "lines" else size)


def clip(line: str, limit: int) -> str:
    """A line cut to ``limit`` characters, saying how much was left out."""
    line = line.rstrip("\r")
    if len(line) <= limit:
        return line
    return f"{line[:limit]}... ({len(line) - limit} more characters)"


def _start(state: BatchState, index: int, handle: JobHandle) -> int:
    """Where child ``index``'s current job continues (0 for a new job: a retry's log
    starts over)."""
    entry = state.log_offsets.get(index)
    if entry and entry[0] == handle.job_id:
        return int(entry[1])
    return 0


def _keep_tail(state: BatchState, index: int, lines: list[str]) -> None:
    if index not in state.log_tails and len(state.log_tails) >= MAX_TAILS:
        return
    state.log_tails[index] = [clip(line, TAIL_LINE_CHARS) for line in lines[-TAIL_LINES:]]


def _plan(
    state: BatchState, reports: dict[str, StatusReport], drain_all: bool
) -> list[tuple[int, JobHandle, bool, JobStatus]]:
    """(index, handle, finished, status) of the children whose logs this poll reads:
    finished ones first (all of them with ``drain_all``: their Jobs go next), then
    running ones in turn, ``CHILDREN_PER_POLL`` in all."""
    finished, running = [], []
    for index, handle in sorted(state.active.items()):
        report = reports.get(handle.job_id)
        if report is None:
            continue
        if report.status.is_terminal:
            finished.append((index, handle, True, report.status))
        elif report.status is JobStatus.RUNNING:
            running.append((index, handle, False, report.status))
    if not drain_all:
        finished = finished[:CHILDREN_PER_POLL]
    room = max(CHILDREN_PER_POLL - len(finished), 0)
    if len(running) > room:
        start = (state.log_turn * room) % len(running)
        running = (running[start:] + running[:start])[:room]
    state.log_turn += 1
    return finished + running


def _fold(
    state: BatchState,
    index: int,
    handle: JobHandle,
    read: tuple[str, int],
    start: int,
    finished: bool,
    emit: Emit,
    max_bytes: int | None,
    line_limit: int,
    drop: bool,
) -> None:
    text, end = read
    lines, moved_to = take(text, start, end, None if finished else max_bytes)
    times = line_times(text)
    for i, line in enumerate(lines):
        emit(index, clip(line, line_limit), times[i] if i < len(times) else None)
    if drop:
        state.log_offsets.pop(index, None)
    else:
        state.log_offsets[index] = [handle.job_id, moved_to]


def show(
    state: BatchState,
    backend: Backend,
    reports: dict[str, StatusReport],
    emit: Emit,
    max_bytes: int | None = LOG_BYTES_PER_POLL,
) -> None:
    """One poll's new lines of every active child (finished ones drained); call it
    before ``batchrun.observe``, which deletes finished children's Jobs."""
    streaming = bool(max_bytes and max_bytes > 0)
    limit = max(max_bytes or 0, TAIL_LINE_CHARS)
    for index, handle, finished, status in _plan(state, reports, drain_all=True):
        try:
            read = None
            if streaming:
                start = _start(state, index, handle)
                read = backend.read_logs(handle, start)
                _fold(state, index, handle, read, start, finished, emit, max_bytes, limit, finished)
            if status is JobStatus.FAILED:
                whole = read[0] if read and start == 0 else backend.read_logs(handle, 0)[0]
                _keep_tail(state, index, whole.split("\n")[:-1])
            elif status is JobStatus.SUCCEEDED:
                state.log_tails.pop(index, None)
        except Exception as exc:  # noqa: BLE001 - a log read never fails the batch
            log.warning("could not read the log of inputs[%d] (%s): %s", index, handle.job_id, exc)


async def ashow(
    state: BatchState,
    backend: Backend,
    reports: dict[str, StatusReport],
    emit: Emit,
    max_bytes: int | None = LOG_BYTES_PER_POLL,
    *,
    drain: bool = False,
) -> None:
    """:func:`show` for the triggerer's event loop, every read capped by ``backend``.

    ``drain`` (a trigger that drives the batch, and so deletes finished children's
    Jobs itself): a finished child is read to its end here, chunk by chunk, and
    dropped (a failed one's tail kept), as :func:`show` does.  Otherwise a finished
    child keeps its offset: the operator's :func:`show` on resume finds nothing new,
    keeps its tail, drops it."""
    if not max_bytes or max_bytes <= 0:
        return
    limit = max(max_bytes, TAIL_LINE_CHARS)
    for index, handle, finished, status in _plan(state, reports, drain_all=drain):
        try:
            if drain and finished:
                await _adrain(state, backend, index, handle, status, emit, limit)
                continue
            start = _start(state, index, handle)
            read = await backend.aread_logs(handle, start)
        except Exception as exc:  # noqa: BLE001 - a log read never ends the wait
            log.warning("could not read the log of inputs[%d] (%s): %s", index, handle.job_id, exc)
            continue
        _fold(state, index, handle, read, start, finished, emit, max_bytes, limit, False)


async def _adrain(
    state: BatchState,
    backend: Backend,
    index: int,
    handle: JobHandle,
    status: JobStatus,
    emit: Emit,
    limit: int,
) -> None:
    """A finished child's remaining lines, in capped reads until the log ends."""
    start, seen = _start(state, index, handle), []
    while True:
        text, end = await backend.aread_logs(handle, start)
        lines, _ = take(text, start, end, None)
        times = line_times(text)
        for i, line in enumerate(lines):
            emit(index, clip(line, limit), times[i] if i < len(times) else None)
        seen = (seen + lines)[-TAIL_LINES:]
        if end == start or not text:
            break
        start = end
    state.log_offsets.pop(index, None)
    if status is JobStatus.FAILED:
        if len(seen) < TAIL_LINES:  # the tail began before this drain: read it whole,
            # from the backend under a capped view (``triggers.batch._CappedReads``)
            whole = getattr(backend, "backend", backend)
            seen = (await whole.aread_logs(handle, 0))[0].split("\n")[:-1]
        _keep_tail(state, index, seen)
    elif status is JobStatus.SUCCEEDED:
        state.log_tails.pop(index, None)


def log_failures(
    state: BatchState,
    finished: list[int],
    reports: dict[str, StatusReport],
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """A warning for each child of ``finished`` (``batchrun.observe``'s) that did not
    succeed, with the reason its last status gave: the task log says why it ended."""
    for index in finished:
        outcome, job = state.done[index], state.jobs.get(index, "")
        if outcome != SUCCEEDED:
            report = reports.get(job)
            why = report.describe() if report else outcome
            logger.warning("inputs[%d] (%s) %s: %s", index, job, outcome.lower(), why)


class StatusLine:
    """When a batch's status line is worth writing: when a count changed, else at
    most every ``every_s`` (a line per poll buries the children's own lines)."""

    def __init__(self, every_s: float = STATUS_EVERY_S) -> None:
        self.every_s = every_s
        self.last: tuple[Any, ...] | None = None
        self.at = 0.0

    def due(self, counts: tuple[Any, ...]) -> bool:
        now = time.monotonic()
        if counts == self.last and now - self.at < self.every_s:
            return False
        self.last, self.at = counts, now
        return True


def forget_finished(state: BatchState) -> None:
    """Drop offsets of children no longer active (cancelled by fail_fast, say)."""
    for index in [i for i in state.log_offsets if i not in state.active]:
        del state.log_offsets[index]


def tail_text(state: BatchState, index: int) -> str:
    """The kept last lines of a failed child, indented for the failure summary."""
    lines = state.log_tails.get(index)
    if not lines:
        return ""
    head = f"    last {len(lines)} log lines of inputs[{index}]:\n"
    return head + "\n".join(f"    [child {index}] {line}" for line in lines)


def failure_summary(state: BatchState, failures: dict[int, BaseException]) -> str:
    """The ``KineticBatchFailed`` message: each failed input, its error and, for a
    child that ran and failed, the last lines of its log."""
    lines = [
        f"kinetic batch {state.group_id}: {len(failures)} of {state.total} "
        "inputs failed (results of the others stay in the store):"
    ]
    for i, exc in sorted(failures.items()):
        job = state.jobs.get(i, "not submitted")
        lines.append(f"  inputs[{i}] ({job}): {type(exc).__name__}: {exc}")
        tail = tail_text(state, i)
        if tail:
            lines.append(tail)
    return "\n".join(lines)


def wire(state: BatchState) -> dict[str, Any]:
    """The log fields of ``state`` in their wire form (to patch a state dict)."""
    return {
        "log_offsets": {str(k): list(v) for k, v in state.log_offsets.items()},
        "log_tails": {str(k): list(v) for k, v in state.log_tails.items()},
        "log_turn": state.log_turn,
    }
