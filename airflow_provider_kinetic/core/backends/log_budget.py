"""A triggerer-wide budget for live log reads, spread fairly over the jobs that want them.

A thousand deferred jobs each reading their log every poll would be a thousand API
calls per interval, however cheaply their status is read (``shared_reads.py``).  So
live log reads (those of jobs still running) are granted from one budget per window
(``calls`` and ``max_bytes``, refilled every ``window_s``), least recently served
first: a job not served in this window is first in the next, so none starves, and a
job is granted at most once per window (one read per poll), so none is read twice
while another waits.  Each reader asks for its own jobs at its tick and gets at most
its share (its jobs' part of all the jobs that want logs), so the readers of two
namespaces do not starve each other either.

A finished job's log is not rationed: it is drained in full before its event (what
the task log promises); what it costs is :meth:`LogBudget.spend`, so the next
window's running jobs pay for it, not the finished one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable

#: Live log reads per window, all jobs of the process together.
LOG_CALLS_PER_WINDOW = 16
#: Live log bytes per window (each read is capped by what is left).
LOG_BYTES_PER_WINDOW = 4 * 1024 * 1024
#: How long a window lasts (the default poll interval).
LOG_WINDOW_S = 5.0


class LogBudget:
    """Grants of live log reads: at most ``calls`` reads and ``max_bytes`` bytes per window."""

    def __init__(
        self,
        calls: int = LOG_CALLS_PER_WINDOW,
        max_bytes: int = LOG_BYTES_PER_WINDOW,
        window_s: float = LOG_WINDOW_S,
    ) -> None:
        self.calls, self.max_bytes, self.window_s = calls, max_bytes, window_s
        self._window_start = -math.inf
        self._calls_left, self._bytes_left = calls, max_bytes
        #: token -> (time last served, order of joining or serving): the fairness order.
        self._order: dict[Hashable, tuple[float, int]] = {}
        self._seq = itertools.count()
        #: reads granted in the current window (no token twice)
        self._granted: set[Hashable] = set()

    def join(self, token: Hashable) -> None:
        """``token`` (one trigger) wants live log reads from now on."""
        self._order.setdefault(token, (-math.inf, next(self._seq)))

    def leave(self, token: Hashable) -> None:
        self._order.pop(token, None)
        self._granted.discard(token)

    def _refill(self, now: float) -> None:
        if now >= self._window_start + self.window_s:
            self._window_start = now
            self._calls_left, self._bytes_left = self.calls, self.max_bytes
            self._granted.clear()

    def grant(self, wanting: Iterable[tuple[Hashable, int]], now: float) -> dict[Hashable, int]:
        """Of ``wanting`` ((token, bytes it would read)), those granted a read now, with
        the byte cap of each: least recently served first, at most this caller's share."""
        self._refill(now)
        asked = [(t, n) for t, n in wanting if t in self._order and t not in self._granted]
        if not asked:
            return {}
        share = math.ceil(self.calls * len(asked) / max(1, len(self._order)))
        asked.sort(key=lambda tn: self._order[tn[0]])
        granted: dict[Hashable, int] = {}
        for token, want in asked:
            if len(granted) >= share or self._calls_left <= 0 or self._bytes_left <= 0:
                break
            cap = max(1, min(want, self._bytes_left))
            granted[token] = cap
            self._calls_left -= 1
            self._bytes_left -= cap
            self._granted.add(token)
            self._order[token] = (now, next(self._seq))  # ties: in the order served
        return granted

    def spend(self, calls: int, nbytes: int, now: float) -> None:
        """Reads made outside the grants (a finished job's drain) count in this window."""
        self._refill(now)
        self._calls_left -= calls
        self._bytes_left -= nbytes
