"""The triggerer's side of a batch it drives: observe, retry and launch while deferred.

A deferrable ``KineticMapOperator`` defers once per try: its trigger launches each
queued child as a slot frees up and fires only when the whole batch has finished, so
the worker resumes once, to collect.  Creating a child is a small call on a payload
that is already uploaded; the calls here are synchronous (the store and cluster
clients are), so the trigger runs :meth:`BatchDriver.step` in a thread.

A triggerer restart re-creates the trigger from the state it was deferred with.  To
continue rather than start over it reads the newest state this deferral saved
(``core.batch.resume.save_driven``, at most every ``SAVE_EVERY_S`` while something
changed); children launched after that save are found again by their derived job
ids (``batchrun.launch(probe=True)``), and children whose jobs were deleted after
they succeeded are known by their results (``observe(result_key=...)``), so nothing
runs twice and no result is dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.resume import load_driven, save_driven
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.spec.handles import StatusReport

#: Seconds between saves of a driven batch's state (only when it changed).
SAVE_EVERY_S = 10.0


class BatchDriver:
    """Store, backend and secret of one driven batch, made in the triggerer."""

    def __init__(self, config_json: str, backend: Backend, log: logging.Logger) -> None:
        from airflow_provider_kinetic.hooks.connection import config_from_json
        from airflow_provider_kinetic.hooks.gcs_auth import store_for
        from airflow_provider_kinetic.hooks.signing import deployment_secret

        self.config = config_from_json(config_json)
        self.store = store_for(self.config)
        self.secret = deployment_secret()
        self.backend = backend
        self.log = log
        self.saved_at = time.monotonic()
        self.dirty = False

    def resume(self, state: BatchState) -> BatchState:
        """The newest state this deferral saved (after a triggerer restart), else ``state``."""
        return load_driven(self.store, state, self.secret)

    def step(self, state: BatchState, reports: dict[str, StatusReport]) -> int:
        """Fold one poll's statuses in, launch what fits, save when due; returns how
        many children finished or were launched (0: nothing changed)."""
        from airflow_provider_kinetic.hooks.signing import result_key

        finished = batchrun.observe(state, reports, self.backend, self.store, result_key)
        batchlogs.log_failures(state, finished, reports, self.log)
        batchlogs.forget_finished(state)
        launched = batchrun.launch(
            state, self.config, self.backend, self.store, self.secret, probe=True
        )
        batchrun.maybe_write_manifest(state, self.store)
        changed = len(finished) + launched
        self.dirty = self.dirty or bool(changed)
        if self.dirty and time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            self.save(state)
        return changed

    def save(self, state: BatchState) -> None:
        save_driven(self.store, state, self.secret)
        self.saved_at, self.dirty = time.monotonic(), False


def finished_event(state: BatchState) -> dict[str, Any]:
    """The one event of a driven batch: the whole state, every child ended."""
    return {"status": "finished", "state": state.to_dict(), "finished": {}}
