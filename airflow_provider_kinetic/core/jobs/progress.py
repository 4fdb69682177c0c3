"""A job's progress as its function reports it, and as the waiting side reads it.

The function calls ``airflow_provider_kinetic.progress.update(step, total, metrics,
message)`` (the writer: ``core/jobs/progress_report.py``); the last update lands in
``{job dir}/progress.json`` beside the result.  A kinetic 0.0.4 runner neither sets
the writer up nor reads the file, and a job without it reads as "no progress"::

    {"v": 1, "step": 1200, "total": 10000, "metrics": {"loss": 0.231},
     "message": "epoch 2", "at": <epoch s>, "first_step": 0, "first_at": <epoch s>}

``first_step`` / ``first_at`` are the first update this process made: the rate since
then gives the ETA, so a reader that starts late (a trigger after a deferral) needs
no history.  The waiting side reads the file with its status poll (a store read, no
cluster API request) through :class:`ProgressWatch`: a task-log line when the step or
a metric changed, and the ``kinetic.job.progress`` gauge (percent done, when the
function gave a total).  Airflow-free: imports only storage and metrics.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

#: The file in the job's dir.
PROGRESS_NAME = "progress.json"
#: Where the function's updates go (the runner sets it; ``-``: a worker host, silent).
PROGRESS_URI_ENV = "KINETIC_PROGRESS_URI"
#: The value of :data:`PROGRESS_URI_ENV` on a host whose updates are not kept.
NOT_KEPT = "-"
#: The gauge the waiting side sets (percent done).
GAUGE = "kinetic.job.progress"
#: The longest message kept (a longer one is cut).
MESSAGE_CHARS = 200
#: The most metrics kept per update.
MAX_METRICS = 32
#: Seconds between two reads of a running job's progress by its waiting side (a
#: thousand deferred jobs: a hundred store reads a second at most; the last read,
#: when the job has ended, is always made).
READ_EVERY_S = 10.0


def progress_key(job_id: str) -> str:
    """``{job_id}/progress.json``: the job's dir is ``{job_id}/`` in the store."""
    return f"{job_id}/{PROGRESS_NAME}"


def _number(name: str, value: Any) -> float | int:
    """``value`` as a plain int or float (a NumPy scalar is one too; a tensor is not:
    ``loss.item()``); TypeError / ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"progress {name} must be a number, got {value!r}")
    value = int(value) if isinstance(value, numbers.Integral) else float(value)
    if not math.isfinite(value):
        raise ValueError(f"progress {name} must be finite, got {value!r}")
    return value


@dataclass(frozen=True)
class Progress:
    """One update: ``step`` of ``total`` (None: unknown), the function's ``metrics``
    and ``message``, made at ``at``; ``first_step`` at ``first_at`` was the first."""

    step: float | int
    total: float | int | None = None
    metrics: Mapping[str, float | int] = field(default_factory=dict)
    message: str | None = None
    at: float = 0.0
    first_step: float | int = 0
    first_at: float = 0.0

    @classmethod
    def checked(
        cls,
        step: Any,
        total: Any = None,
        metrics_: Any = None,
        message: Any = None,
        *,
        at: float,
        first: Progress | None = None,
    ) -> Progress:
        """An update from the function's arguments; TypeError / ValueError naming
        the bad value (a step that is no number, a negative total, a metric that is
        not a finite number, a message that is no string)."""
        step = _number("step", step)
        if step < 0:
            raise ValueError(f"progress step must be >= 0, got {step!r}")
        if total is not None and (total := _number("total", total)) <= 0:
            raise ValueError(f"progress total must be > 0 or None, got {total!r}")
        if metrics_ is None:
            metrics_ = {}
        if not isinstance(metrics_, Mapping):
            raise TypeError(f"progress metrics must be a dict of name -> number, got {metrics_!r}")
        if len(metrics_) > MAX_METRICS:
            raise ValueError(f"progress takes at most {MAX_METRICS} metrics, got {len(metrics_)}")
        clean: dict[str, float | int] = {}
        for name, value in metrics_.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"progress metric names must be non-empty strings, got {name!r}")
            clean[name] = _number(f"metric {name!r}", value)
        if message is not None and not isinstance(message, str):
            raise TypeError(f"progress message must be a string or None, got {message!r}")
        if first is None or step < first.first_step:  # the first, or counting restarted
            first_step, first_at = step, at
        else:
            first_step, first_at = first.first_step, first.first_at
        return cls(
            step, total, clean, message and message[:MESSAGE_CHARS], at, first_step, first_at
        )

    # ---- derived ------------------------------------------------------------------
    @property
    def fraction(self) -> float | None:
        """Done, 0..1 (None without a total)."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.step / self.total))

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate since the first update (None: no total, no rate)."""
        if not self.total or self.step >= self.total:
            return None if not self.total else 0.0
        done, took = self.step - self.first_step, self.at - self.first_at
        if done <= 0 or took <= 0:
            return None
        return (self.total - self.step) * took / done

    def step_text(self) -> str:
        """``step 1,200/10,000 (12%)`` (``step 5`` without a total)."""
        text = f"step {_count(self.step)}"
        if self.total:
            text += f"/{_count(self.total)} ({math.floor(100 * (self.fraction or 0))}%)"
        return text

    def describe(self) -> str:
        """``step 1,200/10,000 (12%), ETA 41 min, loss 0.231, epoch 2``."""
        text = self.step_text()
        eta = self.eta_s
        if eta is not None and self.step < (self.total or 0):
            text += f", ETA {duration_text(eta)}"
        for name, value in self.metrics.items():
            text += f", {name} {value:.4g}"
        if self.message:
            text += f", {self.message}"
        return text

    # ---- wire ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "v": 1,
            "step": self.step,
            "total": self.total,
            "metrics": dict(self.metrics),
            "message": self.message,
            "at": self.at,
            "first_step": self.first_step,
            "first_at": self.first_at,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Progress:
        """A stored update; ValueError / TypeError when it is not one."""
        at = _number("at", raw.get("at", 0.0))
        first = Progress(
            0,
            first_step=_number("first_step", raw.get("first_step", 0)),
            first_at=_number("first_at", raw.get("first_at", at)),
        )
        return cls.checked(
            raw.get("step"),
            raw.get("total"),
            raw.get("metrics"),
            raw.get("message"),
            at=at,
            first=first,
        )

    def to_xcom(self) -> dict[str, Any]:
        """What the task pushes as XCom ``kinetic_progress``: the last update, its
        fraction and its text."""
        return {**self.to_dict(), "fraction": self.fraction, "text": self.describe()}


def _count(value: float | int) -> str:
    return f"{value:,}" if isinstance(value, int) or float(value).is_integer() else f"{value:,.4g}"


def duration_text(seconds: float) -> str:
    """``45 s``, ``41 min``, ``2 h 05 min``."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def read_progress(store: ObjectStore, job_id: str) -> Progress | None:
    """The job's last stored update; None when there is none (no update yet, a
    kinetic runner's job) or it is not one (a torn or foreign file)."""
    try:
        raw = json.loads(store.read_bytes(progress_key(job_id)))
        return Progress.from_dict(raw) if isinstance(raw, dict) else None
    except (ObjectNotFound, ValueError, TypeError):
        return None


class ProgressWatch:
    """The waiting side's view of one job's progress: :meth:`poll` reads the stored
    update and returns a line for the task log when the step or a metric changed
    since the last one shown (None otherwise), setting the gauge as it goes."""

    def __init__(
        self, store: ObjectStore, job_id: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store, self.job_id, self.clock = store, job_id, clock
        self.last: Progress | None = None
        self._shown: tuple[Any, ...] | None = None
        self._next_read = -math.inf

    def due(self, final: bool = False) -> bool:
        """Whether :meth:`poll` would read now (a trigger skips the thread hop if not)."""
        return final or self.clock() >= self._next_read

    def poll(self, final: bool = False) -> str | None:
        """Read at most every :data:`READ_EVERY_S` (``final``: the job ended, read now)."""
        now = self.clock()
        if not final and now < self._next_read:
            return None
        self._next_read = now + READ_EVERY_S
        try:
            found = read_progress(self.store, self.job_id)
        except Exception:  # noqa: BLE001 - the store away or refusing: the status poll
            return None  # says so; progress never fails a wait
        return self.seen(found)

    def seen(self, found: Progress | None) -> str | None:
        if found is None:
            return None
        self.last = found
        shown = (found.step, tuple(sorted(found.metrics.items())))
        if shown == self._shown:
            return None
        self._shown = shown
        if found.fraction is not None:
            metrics.gauge(GAUGE, round(100 * found.fraction, 2))
        return found.describe()
