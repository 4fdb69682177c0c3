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

A capped read (``max_bytes``, see ``Backend.read_logs``) shows whole lines up to the
cap and moves the cursor past just those.  The pod log API cannot start a read at a
line: ``limitBytes`` cuts a read that starts ``sinceSeconds`` before the cursor, a
window holding at least a minute of lines already shown, so a capped request could
return nothing new, forever.  Instead the lines read past the cap are kept
(``PENDING_BYTES`` per pod, for ``_MAX_PENDING`` pods) and the next read at that
offset is served from them, so a chatty log is drained in chunks without being
fetched once per chunk.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_kinetic.core.backends.base import TimedText, lines_within

#: Extra seconds re-read before the last shown line, to absorb clock skew between
#: this machine and the API server (lines already shown are filtered out).
LOG_SINCE_MARGIN_S = 60
#: A cursor is ~0.2 KB: enough for every job a triggerer follows (its log budget reads
#: each only every few polls, so a smaller cache would lose them all in turn).
_MAX_CURSORS = 4096
#: Lines read past a capped read's end, kept per pod for the next read (bytes), and
#: for how many pods at once (the most recently read).
PENDING_BYTES = 8 * 1024 * 1024
_MAX_PENDING = 16

#: (namespace, pod name, pod uid): a recreated pod with the same name is another log.
PodKey = tuple[str, str, str]


@dataclass(frozen=True)
class Cursor:
    """Where a read stopped: lines shown, newest timestamp shown (ns), lines at that instant."""

    count: int
    last_ns: int
    at_last: int

    def after(self, shown: list[tuple[int, str]]) -> Cursor:
        """This cursor moved past ``shown`` (lines that come after it)."""
        if not shown:
            return self
        last_ns = shown[-1][0]
        at_last = sum(1 for ns, _ in shown if ns == last_ns)
        if last_ns == self.last_ns:
            at_last += self.at_last
        return Cursor(self.count + len(shown), last_ns, at_last)


Lines = list[tuple[int, str]]

_CURSORS: OrderedDict[PodKey, Cursor] = OrderedDict()
#: Per pod: (the offset they start at, the lines read but not shown yet).
_PENDING: OrderedDict[PodKey, tuple[int, Lines]] = OrderedDict()
_LOCK = threading.Lock()


class LogTail:
    """One incremental read of one pod's log, from ``offset`` lines already shown.

    The plan asks :meth:`request_kwargs` for the API call, unless
    :meth:`has_pending` (the lines are already here), then :meth:`finish` makes the
    text: parsing a large log is CPU work, so an async caller runs it in a thread.
    """

    def __init__(self, key: PodKey, offset: int, max_bytes: int | None = None):
        self.key = key
        self.offset = offset
        self.max_bytes = max_bytes if max_bytes and max_bytes > 0 else None
        self.body: bytes | None = None
        with _LOCK:
            found = _CURSORS.get(key) if offset else None
            held = _PENDING.get(key)
        self.cursor = found if found is not None and found.count == offset else None
        self.pending = held[1] if held and self.cursor and held[0] == offset else None

    def has_pending(self) -> bool:
        """Whether a capped read can be served from lines kept by the last one."""
        return bool(self.max_bytes and self.pending)

    def request_kwargs(self) -> dict[str, Any]:
        """Extra ``read_namespaced_pod_log`` arguments: a window, when a cursor allows one."""
        if self.cursor is None:
            return {}
        behind = time.time() - self.cursor.last_ns / 1e9
        return {"since_seconds": max(1, math.ceil(behind) + LOG_SINCE_MARGIN_S)}

    def finish(self) -> tuple[str, int]:
        """The text not shown yet (of ``body``, or of the kept lines) and the new offset."""
        if self.body is None and self.has_pending():
            assert self.pending is not None and self.cursor is not None
            count = lines_within([text for _, text in self.pending], self.max_bytes)
            new, rest = self.pending[:count], self.pending[count:]
            cursor: Cursor | None = self.cursor.after(new)
        else:
            new, cursor, rest = advance(
                log_lines(self.body or b""), self.offset, self.cursor, self.max_bytes
            )
        self._remember(cursor, rest)
        text = "".join(line + "\n" for _, line in new)
        return TimedText(text, [ns or None for ns, _ in new]), self.offset + len(new)

    def _remember(self, cursor: Cursor | None, rest: Lines) -> None:
        kept = rest[: lines_within([text for _, text in rest], PENDING_BYTES)]
        with _LOCK:
            _PENDING.pop(self.key, None)
            if cursor is None:
                return
            _CURSORS[self.key] = cursor
            _CURSORS.move_to_end(self.key)
            while len(_CURSORS) > _MAX_CURSORS:
                _CURSORS.popitem(last=False)
            if kept:
                _PENDING[self.key] = (cursor.count, kept)
                while len(_PENDING) > _MAX_PENDING:
                    _PENDING.popitem(last=False)


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
    lines: Lines, offset: int, cursor: Cursor | None, max_bytes: int | None = None
) -> tuple[Lines, Cursor | None, Lines]:
    """Lines not shown yet (at most ``max_bytes`` of them), the cursor after showing
    them, and the new lines left for a later read.

    Without a cursor the whole log was read and the first ``offset`` lines are
    skipped; with one only a recent window was read and lines at or before the
    cursor's timestamp are skipped (counting equal timestamps already shown).
    """
    if cursor is None:
        fresh = lines[offset:]
    else:
        fresh, skipped_equal = [], 0
        for ns, text in lines:
            if ns < cursor.last_ns:
                continue
            if ns == cursor.last_ns and skipped_equal < cursor.at_last:
                skipped_equal += 1
                continue
            fresh.append((ns, text))
    count = lines_within([text for _, text in fresh], max_bytes) if max_bytes else len(fresh)
    new, rest = fresh[:count], fresh[count:]
    if cursor is not None:
        return new, cursor.after(new), rest
    shown = lines[: offset + len(new)]
    if not shown:
        return new, None, rest
    last_ns = shown[-1][0]
    at_last = sum(1 for ns, _ in shown if ns == last_ns)
    return new, Cursor(len(shown), last_ns, at_last), rest
