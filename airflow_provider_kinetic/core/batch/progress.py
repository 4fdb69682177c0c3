"""A batch's progress in one line: children done of total, an ETA from the children
that finished while this process watched, and the step each running child's
function last reported (``core.jobs.progress``)::

    3/6 children done (50%), ETA 4 min; child 3 step 120/1,000 (12%), child 4 step 7

The ETA is the rate of children ending since the first look of this process (a
resumed or re-deferred task starts counting again), so it needs no stored start.
Each running child's progress is one store read of its ``progress.json``, for at
most :data:`CHILDREN_SHOWN` children, made when a count changes or every
:data:`READ_EVERY_S`; the line is written when it changed (:meth:`BatchProgress.poll`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.jobs.progress import duration_text, read_progress
from airflow_provider_kinetic.core.storage import ObjectStore

#: Running children whose reported step the line names (the lowest input indices).
CHILDREN_SHOWN = 8
#: Seconds between two reads of the running children's progress while no count changed.
READ_EVERY_S = 15.0


@dataclass(frozen=True)
class Seen:
    """The first look: ``done`` children had ended at ``at`` (epoch seconds)."""

    done: int
    at: float


class BatchProgress:
    """The line for one batch as this process watches it (``clock``: epoch seconds)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.first: Seen | None = None
        self.last: str | None = None
        self._next_read = -float("inf")

    def poll(self, state: BatchState, store: ObjectStore, changed: bool) -> str | None:
        """The line when it changed (None otherwise), read when a count ``changed``
        or every :data:`READ_EVERY_S` (each read: one store read per shown child)."""
        now = self.clock()
        if not changed and now < self._next_read:
            return None
        self._next_read = now + READ_EVERY_S
        line = self.line(state, store)
        if line == self.last:
            return None
        self.last = line
        return line

    def eta_s(self, state: BatchState) -> float | None:
        """Seconds until every child has ended at the rate seen so far (None: no
        child ended since the first look yet)."""
        done, now = len(state.done), self.clock()
        if self.first is None:
            self.first = Seen(done, now)
        ended, took = done - self.first.done, now - self.first.at
        if ended <= 0 or took <= 0 or done >= state.total:
            return None
        return (state.total - done) * took / ended

    def line(self, state: BatchState, store: ObjectStore) -> str:
        done, total = len(state.done), state.total
        text = f"{done}/{total} children done ({100 * done // max(total, 1)}%)"
        eta = self.eta_s(state)
        if eta is not None:
            text += f", ETA {duration_text(eta)}"
        steps = []
        for index in sorted(state.active)[:CHILDREN_SHOWN]:
            try:
                last = read_progress(store, state.active[index].job_id)
            except Exception:  # noqa: BLE001 - progress never fails the batch's wait
                last = None
            if last is not None:
                steps.append(f"child {index} {last.step_text()}")
        return text + ("; " + ", ".join(steps) if steps else "")
