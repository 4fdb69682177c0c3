"""How often to ask a backend about a job: fast at first, then every ``poll_interval``.

Most local jobs end in well under a second and a TPU job runs for hours, so on the
local backend the first polls come quickly (0.1 s, doubling) and then settle at
``poll_interval``; cluster backends poll every ``poll_interval`` from the start, so
their request rate is what it always was (``Backend.first_poll_s``).  Between polls a
backend may wake early when it can see the job end (the local backend watches for
the supervisor's exit-code file), so a finished job is noticed within ~20 ms.

A poll that cannot read the store (a local mount gone for a while) is not an answer
about the job: :class:`StoreOutage` retries it with backoff for a window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator


def poll_delays(poll_interval: float, first: float | None) -> Iterator[float]:
    """Delays between polls: ``first``, doubling, capped at ``poll_interval``
    (``first=None``: ``poll_interval`` from the start)."""
    delay = poll_interval if first is None else min(first, poll_interval)
    while True:
        yield delay
        delay = min(delay * 2, poll_interval)


#: Default of ``[kinetic] store_outage_window_s``: how long polls ride out a store that
#: cannot be read before giving up.
STORE_OUTAGE_WINDOW_S = 600.0
#: First wait after a poll found the store unreadable; it doubles up to the cap.
OUTAGE_FIRST_S = 0.5
OUTAGE_MAX_S = 10.0


class StoreOutage:
    """A poll that finds the store unreadable (``StoreUnavailable``, any ``OSError``)
    waits and polls again, with backoff, until ``window_s`` after the first failure:
    a store on a mount that went away for a while must not fail the task (and leave
    its job running unwatched).  ``failed`` returns the wait before the next poll, or
    re-raises once the window has passed; ``recovered`` ends an outage."""

    def __init__(self, window_s: float = STORE_OUTAGE_WINDOW_S) -> None:
        self.window_s = window_s
        self.since: float | None = None
        self._delay = OUTAGE_FIRST_S

    def failed(self, exc: BaseException) -> float:
        now = time.monotonic()
        if self.since is None:
            self.since, self._delay = now, OUTAGE_FIRST_S
        if now - self.since >= self.window_s:
            raise exc
        delay = min(self._delay, self.window_s - (now - self.since))
        self._delay = min(self._delay * 2, OUTAGE_MAX_S)
        return max(delay, 0.0)

    def recovered(self) -> float | None:
        """Seconds the outage lasted (``None`` when there was none); resets."""
        if self.since is None:
            return None
        lasted, self.since = time.monotonic() - self.since, None
        return lasted

    def describe(self, exc: BaseException, delay: float) -> str:
        assert self.since is not None
        left = self.window_s - (time.monotonic() - self.since)
        return (
            f"the store cannot be read ({type(exc).__name__}: {exc}); polling again in "
            f"{delay:.1f}s, giving up in {max(left, 0):.0f}s ([kinetic] store_outage_window_s)"
        )
