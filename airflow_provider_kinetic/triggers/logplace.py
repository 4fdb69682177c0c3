"""Where a job trigger's deferral got to in its job's log, kept across triggerer restarts.

The trigger side of :mod:`~airflow_provider_kinetic.core.jobs.logmark`: a trigger
re-created from its kwargs resumes from the mark its deferral saved; a running one
saves it every ``logmark.SAVE_EVERY_S`` while lines flow and when it is stopped.
Never fails the wait: without a store the worst is a repeated line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.jobs import logmark


async def through_cancels(work: Any) -> None:
    """Await ``work`` to its end even if this task is cancelled again meanwhile."""
    future = asyncio.ensure_future(work)
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(future)
    with contextlib.suppress(Exception):
        future.result()


class LogPlace:
    """One deferral's (``deferral``: its ``not_before``) place in ``job_id``'s log;
    ``store`` is called when needed; lines go to ``trigger``'s log."""

    def __init__(
        self,
        store: Callable[[], Any],
        job_id: str,
        deferral: float,
        offset: int,
        trigger: Any,
    ) -> None:
        self.store, self.job_id, self.deferral, self.trigger = store, job_id, deferral, trigger
        self._saved = (time.monotonic(), offset)

    def resume(self, offset: int) -> int:
        """The offset to continue from: the deferral's saved mark, else ``offset``."""
        try:
            saved = logmark.load(self.store(), self.job_id, self.deferral)
        except Exception as exc:  # noqa: BLE001 - an account (no store: a repeat at worst)
            self.trigger.log.warning("kinetic job %s: log place not read: %s", self.job_id, exc)
            return offset
        if saved is None or saved == offset:
            return offset
        self.trigger.log.info(
            "kinetic job %s: continuing its log where this deferral left it", self.job_id
        )
        self._saved = (time.monotonic(), saved)
        return saved

    def due(self, offset: int) -> bool:
        """Whether a running trigger saves now (moved, and not saved for a while)."""
        when, saved = self._saved
        return offset != saved and time.monotonic() - when >= logmark.SAVE_EVERY_S

    def save(self, offset: int) -> None:
        """Write the mark (nothing when it has not moved since the last save)."""
        if self._saved[1] == offset:
            return
        self._saved = (time.monotonic(), offset)
        try:
            logmark.save(self.store(), self.job_id, logmark.LogMark(self.deferral, offset))
        except Exception as exc:  # noqa: BLE001 - an account (no store: a repeat at worst)
            self.trigger.log.warning("kinetic job %s: log place not saved: %s", self.job_id, exc)
