"""A job's log line into the task log at the time the job wrote it, not the poll's.

Airflow 3 logs through structlog, whose time stamper keeps a ``timestamp`` the event
already has (``MaybeTimeStamper``): the line is logged with the job's own time,
formatted as Airflow's ``iso`` stamps are.  A standard-library logger (``dag.test()``
under a plain logging set-up, tests) gets a record whose ``created`` is that time.
Without a time (a backend that does not know it) the line is logged as any other.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def iso(ns: int) -> str:
    """``ns`` since the epoch as Airflow's ``iso`` log stamps write it (UTC, ``Z``)."""
    at = datetime.fromtimestamp(ns // 10**9, UTC).replace(microsecond=ns // 1000 % 10**6)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def info_at(logger: Any, ns: int | None, msg: str, *args: Any) -> None:
    """``logger.info(msg, *args)``, stamped with ``ns`` where given."""
    if ns is None:
        logger.info(msg, *args)
    elif isinstance(logger, logging.LoggerAdapter):
        info_at(logger.logger, ns, msg, *args)
    elif isinstance(logger, logging.Logger):
        if logger.isEnabledFor(logging.INFO):
            record = logger.makeRecord(logger.name, logging.INFO, "(job)", 0, msg, args, None)
            record.created = ns / 1e9
            record.msecs = (ns // 1_000_000) % 1000
            logger.handle(record)
    else:  # structlog: the event keeps the timestamp it brings
        logger.info(msg, *args, timestamp=iso(ns))


def timed_lines(text: str) -> list[tuple[str, int | None]]:
    """``text.splitlines()``, each with the time of the ``text.split("\\n")`` line it
    came from where ``text`` is a ``backends.base.TimedText``, else None."""
    times: Sequence[int | None] = getattr(text, "times", ())
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    return [
        (line, times[i] if i < len(times) else None)
        for i, piece in enumerate(pieces)
        for line in (piece.splitlines() or [""])
    ]
