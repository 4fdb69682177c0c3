"""How often to ask a backend about a job: fast at first, then every ``poll_interval``.

Most local jobs end in well under a second and a TPU job runs for hours, so on the
local backend the first polls come quickly (0.1 s, doubling) and then settle at
``poll_interval``; cluster backends poll every ``poll_interval`` from the start, so
their request rate is what it always was (``Backend.first_poll_s``).  Between polls a
backend may wake early when it can see the job end (the local backend watches for
the supervisor's exit-code file), so a finished job is noticed within ~20 ms.
"""

from __future__ import annotations

from collections.abc import Iterator


def poll_delays(poll_interval: float, first: float | None) -> Iterator[float]:
    """Delays between polls: ``first``, doubling, capped at ``poll_interval``
    (``first=None``: ``poll_interval`` from the start)."""
    delay = poll_interval if first is None else min(first, poll_interval)
    while True:
        yield delay
        delay = min(delay * 2, poll_interval)
