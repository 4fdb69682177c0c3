"""The triggerer's side of a batch it drives: observe, retry and launch while deferred.

A deferrable ``KineticMapOperator`` defers once per try: its trigger launches each
queued child as a slot frees up and fires only when the whole batch has finished, so
the worker resumes once, to collect.  Creating a child is a small call on a payload
that is already uploaded; the calls here are synchronous (the store and cluster
clients are), so the trigger runs :meth:`BatchDriver.step` in a thread.

A triggerer restart re-creates the trigger from the state it was deferred with.  To
continue rather than start over it reads the newest state this deferral saved
(``core.batch.resume.DrivenSaves``: each save a delta of what changed since the
previous one); children launched after that save are found again by their derived
job ids (``batchlaunch.launch(probe=True)``: a launch whose create intent the batch's
launch record holds is probed, and adopted when its ``handle.json`` says it was
created, never created again), an input that moved on to a later launch meanwhile
is followed to it (``launchrecord.follow``), and children whose jobs were deleted
after they succeeded are known by their results (``observe(result_key=...)``), so
nothing runs twice and no result is dropped.

A step runs in a thread, which cancelling the trigger does not stop.  So a stopping
trigger sets :attr:`BatchDriver.halt` (the step launches no more) and saves only once
the step in flight has ended: a save taken beside a step could hold an input taken
off the queue but not yet active, lost to the next trigger.  The driver itself makes
that so (:attr:`BatchDriver.busy`: a save waits for the step in flight), not the
trigger's wait for its work: a triggerer stops by leaving ``asyncio.run``, whose
teardown cancels every task of the loop, the task of the driver's work too, which
then reads as ended while its thread still launches.

Saves follow progress, not time: one when a ``1/SAVES_PER_BATCH`` share of the
batch's launches and ends has happened since the last (and at most every
``SAVE_EVERY_S``), and on cancel and at the end.  So a batch writes a bounded number
of state objects whatever its size or length (N + c writes in all), each about as
large as what changed; a restart costs at most that share of children probed again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import launchrecord
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.resume import DrivenSaves
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore

#: Seconds between saves of a driven batch's state at least (only when it changed).
SAVE_EVERY_S = 10.0
#: Saves of a driven batch's state over its life, from progress (launches and ends).
SAVES_PER_BATCH = 16


def save_threshold(total: int) -> int:
    """Changes (a launch or an end each, two per input) between two saves."""
    return max(1, -(-2 * total // SAVES_PER_BATCH))


class BatchDriver:
    """Store, backend and secret of one driven batch (made in the triggerer by
    :meth:`for_trigger`; the benchmark makes one from its own parts)."""

    def __init__(
        self,
        config: KineticConfig,
        store: ObjectStore,
        secret: bytes,
        backend: Backend,
        log: logging.Logger,
        result_key: Callable[[JobHandle], str | None],
    ) -> None:
        self.config, self.store, self.secret = config, store, secret
        self.backend = backend
        self.log = log
        self.result_key = result_key
        self.saved_at = time.monotonic()
        self.changes = 0  # launches and ends since the last save
        self.saves = DrivenSaves(self.store, self.secret)
        self.halt = threading.Event()  # set when the trigger is stopped: launch no more
        # Held by a step and by a save: a save never reads the batch beside a step.
        self.busy = threading.Lock()

    @classmethod
    def for_trigger(cls, config_json: str, backend: Backend, log: logging.Logger) -> BatchDriver:
        from airflow_provider_kinetic.deployment.connection import config_from_json
        from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
        from airflow_provider_kinetic.gcp.gcs_auth import store_for

        config = config_from_json(config_json)
        return cls(config, store_for(config), deployment_secret(), backend, log, result_key)

    def resume(self, state: BatchState) -> BatchState:
        """The newest state this deferral saved (after a triggerer restart), else
        ``state``, with the create intents of the batch's launch record; an input it
        lost track of (a save of an older version beside a launch) is adopted or
        launched again at once (``batchlaunch.recover``)."""
        latest = self.saves.load(state)
        # Create intents a driver before this one recorded after its last save.
        recorded = launchrecord.LaunchRecord.read(self.store, latest.group_id)
        for index, n in recorded.intended.items():
            latest.intended[index] = max(n, latest.intended.get(index, 0))
        batchlaunch.recover(latest, self.config, self.backend, self.store, self.secret)
        return latest

    def step(self, state: BatchState, reports: dict[str, StatusReport]) -> int:
        """Fold one poll's statuses in, launch what fits, save when due; returns how
        many children finished or were launched (0: nothing changed)."""
        with self.busy:
            return self._step(state, reports)

    def _step(self, state: BatchState, reports: dict[str, StatusReport]) -> int:
        launchrecord.follow(state, reports, self.store)  # an input moved on (an old state)
        finished = batchrun.observe(state, reports, self.backend, self.store, self.result_key)
        batchlogs.log_failures(state, finished, reports, self.log)
        batchlogs.forget_finished(state)
        launched = batchlaunch.launch(
            state,
            self.config,
            self.backend,
            self.store,
            self.secret,
            probe=True,
            halted=self.halt.is_set,
        )
        batchmanifest.maybe_write_manifest(state, self.store)
        changed = len(finished) + launched
        self.changes += changed
        if (
            self.changes >= save_threshold(state.total)
            and time.monotonic() - self.saved_at >= SAVE_EVERY_S
        ):
            self._save(state)
        return changed

    def save(self, state: BatchState) -> None:
        """A delta of what changed since the last save: at progress steps, and always
        on cancel and at the end (the log offsets shown since count too, so a new
        trigger neither repeats nor skips lines).  Waits for a step in flight."""
        with self.busy:
            self._save(state)

    def _save(self, state: BatchState) -> None:
        self.saves.save(state)
        self.saved_at, self.changes = time.monotonic(), 0


def finished_event(state: BatchState) -> dict[str, Any]:
    """The one event of a driven batch: the whole state, every child ended."""
    return {"status": "finished", "state": state.to_dict(), "finished": {}}
