"""Durations as people write them: ``45s``, ``30m``, ``12h``, ``7d``.

One parser for the CLI's ages (``--older-than 7d``, ``--since 12h``) and the operators'
waits (``capacity_wait="15m"``).  A templated operator value may also be a bare number
of seconds (``"900"``) or carry blanks (``"15 m"``); a CLI flag may not.  Stdlib-only.
"""

from __future__ import annotations

import re

#: Seconds per unit.
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(\s*)([smhd])?")


def duration_s(text: object, *, lenient: bool = False) -> float | None:
    """``text`` in seconds, or None when it is not a duration.  ``lenient``: a bare
    number means seconds, and blanks may stand between the number and its unit."""
    match = _DURATION.fullmatch(str(text).strip().lower())
    if not match:
        return None
    number, blanks, unit = match.groups()
    if not lenient and (blanks or unit is None):
        return None
    return float(number) * UNIT_S[unit or "s"]
