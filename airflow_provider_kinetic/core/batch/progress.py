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
        running = {i: state.active[i].job_id for i in state.active}
        steps = child_steps(store, running)
        return Summary(len(state.done), state.total, self.eta_s(state), steps).describe()


@dataclass(frozen=True)
class Summary:
    """A batch's progress: ``done`` of ``total`` children ended, the ETA (seconds;
    None: unknown) and each running child's reported step, by input index."""

    done: int
    total: int
    eta_s: float | None
    steps: dict[int, str]

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total > 0 else 0.0

    def describe(self) -> str:
        """``3/6 children done (50%), ETA 4 min; child 3 step 120/1,000 (12%)``."""
        done, total = self.done, self.total
        text = f"{done}/{total} children done ({100 * done // max(total, 1)}%)"
        if self.eta_s is not None:
            text += f", ETA {duration_text(self.eta_s)}"
        steps = [f"child {i} {step}" for i, step in sorted(self.steps.items())]
        return text + ("; " + ", ".join(steps) if steps else "")

    def to_json(self) -> dict[str, object]:
        """What the Kinetic tab's children feed carries (its bar and text)."""
        return {"done": self.done, "total": self.total, "fraction": self.fraction,
                "eta_s": self.eta_s, "text": self.describe()}  # fmt: skip


def child_steps(store: ObjectStore, running: dict[int, str]) -> dict[int, str]:
    """The step each running child (input index -> job id) last reported, for the
    first :data:`CHILDREN_SHOWN` (one store read each); children silent so far left out."""
    steps = {}
    for index in sorted(running)[:CHILDREN_SHOWN]:
        try:
            last = read_progress(store, running[index])
        except Exception:  # noqa: BLE001 - progress never fails a batch's wait or page
            last = None
        if last is not None:
            steps[index] = last.step_text()
    return steps


def summary(
    store: ObjectStore, total: int, done: int, running: dict[int, str], elapsed_s: float | None
) -> Summary:
    """A batch's progress seen from outside its task (the Kinetic tab: no process that
    watched it): the ETA from the children that finished since the batch was
    submitted ``elapsed_s`` ago, at the rate they finished."""
    eta = None
    if elapsed_s and elapsed_s > 0 and 0 < done < total:
        eta = (total - done) * elapsed_s / done
    return Summary(done, total, eta, child_steps(store, running))
