"""``core.batch.logs``: capped reads keep offsets exact; a poll reads a bounded set of
children, in turn; failed children's tails and the wire form stay bounded.

The local backend reads real log files here (written by the test where a child's
runner would write them); statuses come in as the batch's status poll reports them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport
from tests.fixtures import records


def test_take_caps_by_whole_lines_in_the_offsets_unit() -> None:
    text = "aaaa\nbbbb\ncccc\n"
    # Offsets in lines (pod logs): 3 lines moved the offset by 3.
    assert batchlogs.take(text, 10, 13, 10) == (["aaaa", "bbbb"], 12)
    # Offsets in bytes (local log files): 15 bytes.
    assert batchlogs.take(text, 100, 115, 10) == (["aaaa", "bbbb"], 110)
    assert batchlogs.take(text, 100, 115, None) == (["aaaa", "bbbb", "cccc"], 115)
    # A line longer than the cap still moves on (shown clipped).
    assert batchlogs.take("x" * 50 + "\nyy\n", 0, 54, 10) == (["x" * 50], 51)
    assert batchlogs.clip("x" * 50, 10) == "xxxxxxxxxx... (40 more characters)"
    # Multi-byte text counts its UTF-8 bytes.
    assert batchlogs.take("é" * 4 + "\nzz\n", 0, 12, 9) == (["é" * 4], 9)


def test_take_shows_everything_when_the_unit_cannot_be_verified() -> None:
    # b"\xff\n" decoded with replacements is "\ufffd\n": 2 bytes read, 4 re-encoded.
    lossy = b"\xff\nabc\n".decode("utf-8", "replace")
    assert batchlogs.take(lossy, 0, 6, 3) == (["\ufffd", "abc"], 6)


def _children(tmp_path: Path, n: int) -> tuple[LocalBackend, BatchState]:
    root = str(tmp_path)
    backend = LocalBackend(root)
    state = records.batch_state(n, {i: f"job-{i:08x}" for i in range(n)}, root=root)
    for i in range(n):
        jdir = Path(backend.job_dir(f"job-{i:08x}"))
        jdir.mkdir(parents=True)
        (jdir / "log").write_text("".join(f"{i}:{j}\n" for j in range(3)))
    return backend, state


def test_a_poll_reads_a_bounded_set_of_running_children_in_turn(tmp_path: Path) -> None:
    backend, state = _children(tmp_path, 20)
    running = {h.job_id: StatusReport(JobStatus.RUNNING) for h in state.active.values()}
    seen: dict[int, list[str]] = defaultdict(list)
    for turn in range(3):  # 20 children, 8 per poll: everyone within 3 polls
        shown: set[int] = set()

        def emit(index: int, line: str, ns: int | None, shown: set[int] = shown) -> None:
            shown.add(index)
            seen[index].append(line)

        batchlogs.show(state, backend, running, emit)
        assert len(shown) == min(batchlogs.CHILDREN_PER_POLL, 20 - 8 * turn), turn
        state = BatchState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert dict(seen) == {i: [f"{i}:{j}" for j in range(3)] for i in range(20)}
    assert len(state.log_offsets) == 20 and state.log_turn == 3


def test_failed_children_keep_bounded_tails_and_finished_ones_no_offsets(tmp_path: Path) -> None:
    backend, state = _children(tmp_path, 15)
    for i in range(15):
        with open(Path(backend.job_dir(f"job-{i:08x}")) / "log", "a") as f:
            f.writelines(f"more {i}:{j} " + "y" * 400 + "\n" for j in range(30))
    failed = {h.job_id: StatusReport(JobStatus.FAILED) for h in state.active.values()}
    lines: list[tuple[int, str]] = []
    batchlogs.show(state, backend, failed, lambda i, line, ns: lines.append((i, line)))
    assert len(lines) == 15 * 33  # finished children are drained in full, whatever the cap
    assert sorted(state.log_tails) == list(range(batchlogs.MAX_TAILS))
    tail = state.log_tails[3]
    assert len(tail) == batchlogs.TAIL_LINES and tail[-1].startswith("more 3:29 ")
    assert all(len(line) < batchlogs.TAIL_LINE_CHARS + 40 for line in tail)
    assert state.log_offsets == {}
    summary = batchlogs.failure_summary(state, {3: RuntimeError("boom"), 12: RuntimeError("b")})
    assert "inputs[3] (job-00000003): RuntimeError: boom" in summary
    assert "[child 3] more 3:10 " in summary and "more 3:9 " not in summary
    assert "inputs[12]" in summary and "log lines of inputs[12]" not in summary


def test_status_line_is_due_on_a_change_or_once_a_minute(monkeypatch) -> None:
    """The batch status line: written when a count changes, not at every poll, and
    repeated unchanged at most every ``every_s``."""
    now = [1000.0]
    monkeypatch.setattr(batchlogs.time, "monotonic", lambda: now[0])
    line = batchlogs.StatusLine(every_s=60.0)
    assert line.due((2, 1, 0))  # the first line
    now[0] += 5
    assert not line.due((2, 1, 0))  # same counts, 5 s later
    assert line.due((1, 2, 0))  # a count changed
    now[0] += 59
    assert not line.due((1, 2, 0))
    now[0] += 1
    assert line.due((1, 2, 0))  # a minute without a change
    assert not line.due((1, 2, 0))
