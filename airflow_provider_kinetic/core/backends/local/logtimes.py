"""When each line of a local job's log was written: ``{job dir}/log.times``.

The supervisor passes the job's output into its ``log`` line by line and, before each
line, appends one fixed-size record to ``log.times``: the line's byte offset in
``log`` and the time (ns since the epoch).  ``read_logs`` looks its lines' times up
there (a binary search, then one read), so a sweep's child lines keep the time they
were written rather than that of the poll that read them.  A line without a record
(something written to the log by the supervisor itself, or a piece of a line longer
than a read's cap) takes the time of the record before it, or None.

Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Sequence

TIMES_FILE = "log.times"
_RECORD = struct.Struct("<QQ")  # (offset, ns)
#: Records one lookup reads beyond the first (a read's lines; more take None).
MAX_RECORDS = 1 << 16


def open_for_append(jdir: str) -> int:
    """The fd the supervisor appends records to."""
    return os.open(os.path.join(jdir, TIMES_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def record(fd: int, offset: int, ns: int) -> None:
    os.write(fd, _RECORD.pack(offset, ns))


class _Records(Sequence):
    """``log.times`` as a sequence of offsets, read a record at a time (bisect)."""

    def __init__(self, f: object, count: int) -> None:
        self.f, self.count = f, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> int:  # type: ignore[override]
        self.f.seek(i * _RECORD.size)  # type: ignore[attr-defined]
        return _RECORD.unpack(self.f.read(_RECORD.size))[0]  # type: ignore[attr-defined]


def times_for(jdir: str, offset: int, text: str) -> list[int | None]:
    """The time of each line of ``text`` (``text.split("\\n")``), read at byte
    ``offset`` of the job's log; [] when the job has no ``log.times``."""
    try:
        f = open(os.path.join(jdir, TIMES_FILE), "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return []
    with f:
        count = os.fstat(f.fileno()).st_size // _RECORD.size
        if not count:
            return []
        first = max(bisect.bisect_right(_Records(f, count), offset) - 1, 0)
        f.seek(first * _RECORD.size)
        raw = f.read(_RECORD.size * min(count - first, MAX_RECORDS))
    records = [_RECORD.unpack_from(raw, i) for i in range(0, len(raw), _RECORD.size)]
    offsets = [o for o, _ in records]
    times: list[int | None] = []
    start = offset
    for line in text.split("\n"):
        at = bisect.bisect_right(offsets, start) - 1
        times.append(records[at][1] if at >= 0 else None)
        start += len(line.encode()) + 1
    return times
