"""The job's side of progress: what ``airflow_provider_kinetic.progress.update`` does.

The runner sets ``KINETIC_PROGRESS_URI`` (``{job dir}/progress.json``) before it
calls the function (host 0 only; other hosts get ``-`` and their updates are
dropped), and calls :func:`flush` when the function ended.  :class:`Reporter` keeps
the store writes few: an update is written when the last write is at least
``KINETIC_PROGRESS_MIN_S`` (default 5 s) old, otherwise kept and written by the
next update past that, or by :func:`flush` at the end (the last update is always
written).  A write that fails is logged, never raised: progress never fails a job.

Outside a job (no ``KINETIC_PROGRESS_URI``: a test run, a notebook) :func:`update`
does nothing and warns once.  Airflow-free: the runner's process imports it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.jobs.progress import NOT_KEPT, PROGRESS_URI_ENV, Progress
from airflow_provider_kinetic.core.storage import ObjectStore, store_for_uri

log = logging.getLogger("kinetic.progress")

#: Seconds between two store writes of progress (at most one write per this).
MIN_INTERVAL_ENV = "KINETIC_PROGRESS_MIN_S"
DEFAULT_MIN_INTERVAL_S = 5.0


class Reporter:
    """One process's progress writer into ``key`` of ``store`` (see the module doc);
    ``clock`` gives epoch seconds (tests pass a fake one)."""

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        min_interval: float = DEFAULT_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min_interval < 0:
            raise ValueError(f"progress min_interval must be >= 0 seconds, got {min_interval!r}")
        self.store, self.key, self.min_interval, self.clock = store, key, min_interval, clock
        self.latest: Progress | None = None
        self.writes = 0
        self._pending = False
        self._written_at: float | None = None
        self._lock = threading.Lock()

    def update(
        self, step: Any, total: Any = None, metrics: Any = None, message: Any = None
    ) -> bool:
        """Record an update (checked: bad values raise naming them); whether it was
        written now (False: kept for the next write)."""
        now = self.clock()
        with self._lock:
            self.latest = Progress.checked(step, total, metrics, message, at=now, first=self.latest)
            due = self._written_at is None or now - self._written_at >= self.min_interval
            self._pending = True
            if due:
                self._write(now)
            return due

    def flush(self) -> bool:
        """Write the last update if it was not yet; whether one was written."""
        with self._lock:
            if not self._pending:
                return False
            self._write(self.clock())
            return True

    def _away(self) -> bool:
        """A local store whose job dir (made at submit) is missing (``runner/remote.py``
        waits for it before the result; progress just skips the write)."""
        if self.store.scheme != "file":
            return False
        job_dir = self.key.rsplit("/", 1)[0] if "/" in self.key else ""
        return not os.path.isdir(os.path.join(str(getattr(self.store, "bucket", os.sep)), job_dir))

    def _write(self, now: float) -> None:
        assert self.latest is not None
        self._written_at, self._pending = now, False
        if self._away():
            return  # a local store that is away: writing would recreate its root empty
        try:
            self.store.write_bytes(self.key, json.dumps(self.latest.to_dict()).encode())
            self.writes += 1
        except Exception as exc:  # noqa: BLE001 - progress never fails the job
            log.warning("could not write progress to %s: %s", self.store.uri(self.key), exc)


_reporter: Reporter | None = None
_reporter_uri: str | None = None
_warned = False
_lock = threading.Lock()


def _min_interval() -> float:
    raw = os.environ.get(MIN_INTERVAL_ENV)
    try:
        value = float(raw) if raw else DEFAULT_MIN_INTERVAL_S
    except ValueError:
        log.warning("%s=%r is not a number: using %s", MIN_INTERVAL_ENV, raw, "the default")
        return DEFAULT_MIN_INTERVAL_S
    return max(0.0, value)


def _current() -> Reporter | None:
    """This process's reporter, made from the environment on first use (None: not
    in a job, or a host whose updates are not kept)."""
    global _reporter, _reporter_uri, _warned
    uri = os.environ.get(PROGRESS_URI_ENV)
    with _lock:
        if _reporter is not None and _reporter_uri == uri:
            return _reporter
        if not uri:
            if not _warned:
                _warned = True
                log.warning(
                    "progress.update() outside a kinetic job (no %s): ignored", PROGRESS_URI_ENV
                )
            return None
        if uri == NOT_KEPT:
            return None
        store, key = store_for_uri(uri)
        _reporter, _reporter_uri = Reporter(store, key, _min_interval()), uri
        return _reporter


def update(
    step: float, total: float | None = None, metrics: Any = None, message: str | None = None
) -> None:
    """Report the job's progress: ``step`` of ``total`` (None: unknown), a dict of
    ``metrics`` (name -> number, the latest values) and a short ``message``.  Cheap
    to call every step: at most one store write per ``KINETIC_PROGRESS_MIN_S``."""
    reporter = _current()
    if reporter is None:
        # Outside a job the values are still checked: a bad call fails in a local test.
        Progress.checked(step, total, metrics, message, at=0.0)
        return
    reporter.update(step, total, metrics, message)


def flush() -> None:
    """Write the last update if it is pending (the runner, when the function ended)."""
    reporter = _reporter
    if reporter is not None:
        reporter.flush()
