"""Incremental pod logs: each line shown once, without re-reading the whole log each poll.

The backend contract counts ``offset`` in lines already shown, so any process can
resume from it: with only the offset, the whole log is read and the first
``offset`` lines are skipped.  That costs the full log per poll, so this process
also remembers, per pod, the timestamp of the last line it showed (a cursor)
and, when asked to continue from exactly that offset, reads only a recent window
(``sinceSeconds``, with a margin for clock skew) and drops lines at or before the
cursor.  Lines are requested with ``timestamps=true`` for this; the
timestamps are stripped from the text returned.

The cursor cache is process-wide (a trigger may build a new backend per poll)
and bounded; a miss only costs a full read.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: Extra seconds re-read before the last shown line, to absorb clock skew between
#: this machine and the API server (lines already shown are filtered out).
LOG_SINCE_MARGIN_S = 60
_MAX_CURSORS = 512

#: (namespace, pod name, pod uid): a recreated pod with the same name is another log.
PodKey = tuple[str, str, str]


@dataclass(frozen=True)
class Cursor:
    """Where a read stopped: lines shown, newest timestamp shown (ns), lines at that instant."""

    count: int
    last_ns: int
    at_last: int


_CURSORS: OrderedDict[PodKey, Cursor] = OrderedDict()
_LOCK = threading.Lock()


def forget_all() -> None:
    """Drop every cursor (what a fresh process starts with)."""
    with _LOCK:
        _CURSORS.clear()


class LogTail:
    """One incremental read of one pod's log, from ``offset`` lines already shown."""

    def __init__(self, key: PodKey, offset: int):
        self.key = key
        self.offset = offset
        with _LOCK:
            found = _CURSORS.get(key) if offset else None
        self.cursor = found if found is not None and found.count == offset else None

    def request_kwargs(self) -> dict[str, Any]:
        """Extra ``read_namespaced_pod_log`` arguments: a window, when a cursor allows one."""
        if self.cursor is None:
            return {}
        behind = time.time() - self.cursor.last_ns / 1e9
        return {"since_seconds": max(1, math.ceil(behind) + LOG_SINCE_MARGIN_S)}

    def consume(self, body: bytes) -> tuple[str, int]:
        """The text not shown yet and the new offset; remembers the new cursor."""
        new, cursor = advance(log_lines(body), self.offset, self.cursor)
        if cursor is not None:
            with _LOCK:
                _CURSORS[self.key] = cursor
                _CURSORS.move_to_end(self.key)
                while len(_CURSORS) > _MAX_CURSORS:
                    _CURSORS.popitem(last=False)
        return "".join(text + "\n" for _, text in new), self.offset + len(new)


def log_lines(body: bytes) -> list[tuple[int, str]]:
    """Whole lines of a ``timestamps=true`` log as (ns since epoch, text).

    A last line without a newline is still being written and is left for the
    next read, so no line is ever shown in two pieces.
    """
    text = body.decode("utf-8", "replace")
    complete = text[: text.rfind("\n") + 1]
    result: list[tuple[int, str]] = []
    last = 0
    for line in complete.splitlines():
        stamp, sep, rest = line.partition(" ")
        ns = stamp_ns(stamp) if sep else None
        if ns is None:  # not a timestamped line: keep it, ordered with its predecessor
            result.append((last, line))
        else:
            last = ns
            result.append((ns, rest))
    return result


def stamp_ns(stamp: str) -> int | None:
    """RFC 3339 (nano) UTC timestamp -> integer nanoseconds (floats would lose order)."""
    if not stamp.endswith("Z"):
        return None
    whole, _, frac = stamp[:-1].partition(".")
    try:
        seconds = int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())
        return seconds * 1_000_000_000 + int((frac or "0").ljust(9, "0")[:9])
    except ValueError:
        return None


def advance(
    lines: list[tuple[int, str]], offset: int, cursor: Cursor | None
) -> tuple[list[tuple[int, str]], Cursor | None]:
    """Lines not shown yet and the cursor after showing them.

    Without a cursor the whole log was read and the first ``offset`` lines are
    skipped; with one only a recent window was read and lines at or before the
    cursor's timestamp are skipped (counting equal timestamps already shown).
    """
    if cursor is None:
        new = lines[offset:]
        shown = lines[: offset + len(new)]
        if not shown:
            return new, None
        last_ns = shown[-1][0]
        at_last = sum(1 for ns, _ in shown if ns == last_ns)
        return new, Cursor(len(shown), last_ns, at_last)
    new, skipped_equal = [], 0
    for ns, text in lines:
        if ns < cursor.last_ns:
            continue
        if ns == cursor.last_ns and skipped_equal < cursor.at_last:
            skipped_equal += 1
            continue
        new.append((ns, text))
    if not new:
        return new, cursor
    last_ns = new[-1][0]
    at_last = sum(1 for ns, _ in new if ns == last_ns)
    if last_ns == cursor.last_ns:
        at_last += cursor.at_last
    return new, Cursor(cursor.count + len(new), last_ns, at_last)
