"""Resume after preemption: this run's attempt number, start record and checkpoints.

Every run of a task's job sees ``KINETIC_ATTEMPT`` (1, 2, ... across preemption
resubmits, capacity steps and Airflow retries or clears of the same task run) and
``KINETIC_CHECKPOINT_DIR``, a local directory whose files persist across attempts.
:class:`Resume` does, in the runner's order:

1. :meth:`Resume.begin`, first thing (accelerator time starts with the process): claim
   the next attempt number (a marker object created only if absent, so two starts never
   get the same number; a job that never started uses none) and, on host 0, write
   ``started.json`` beside the result (``core/jobs/checkpoint.py``: the reader shares
   the names);
2. :meth:`Resume.restore`, after the workspace is ready: the slot's last snapshot into
   ``{workdir}/checkpoint`` (``runner/checkpoint.py``), the env set, and a daemon thread
   syncing every ``KINETIC_CHECKPOINT_SYNC_S`` (default 60 s);
3. :meth:`Resume.finish` when the function returned or raised (one last sync), or
   :meth:`Resume.on_sigterm` from the SIGTERM handler (a cancel, or GKE's preemption
   notice): one last sync within ``KINETIC_CHECKPOINT_GRACE_S`` (default 20 s, inside
   GKE's default 30 s grace period), then the runner leaves as before.

A job without ``KINETIC_CHECKPOINT_URI`` (kinetic's own client, a runner started by
hand) still gets both variables: attempt 1 and a directory that lives as long as the
run.  Multi-host jobs: each host syncs its own files under ``host-{h}/`` and counts its
own attempts (hosts of a LeaderWorkerSet group are restarted together, so they agree).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from airflow_provider_kinetic.core.jobs.checkpoint import (
    ATTEMPT_ENV,
    ATTEMPTS_DIR,
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_URI_ENV,
    DEFAULT_SYNC_S,
    SYNC_S_ENV,
    attempt_marker_key,
    attempts_in,
    host_key,
    started_key,
    started_record,
)
from airflow_provider_kinetic.core.storage import ObjectStore, PreconditionFailed, store_for_uri
from airflow_provider_kinetic.runner.checkpoint import CheckpointSync
from airflow_provider_kinetic.runner.workspace import PhaseError

log = logging.getLogger("kinetic.runner")

#: Seconds the SIGTERM handler may spend on the last sync (GKE's default grace is 30 s).
GRACE_S_ENV = "KINETIC_CHECKPOINT_GRACE_S"
DEFAULT_GRACE_S = 20.0
#: Tries to claim an attempt number when other starts take the same numbers.
CLAIM_TRIES = 20


def claim_attempt(store: ObjectStore, prefix: str, record: bytes) -> int:
    """The next attempt number under ``prefix``: one more than the highest marker,
    taken by creating its marker only if absent (a racing start takes the next one)."""
    for _ in range(CLAIM_TRIES):
        found = attempts_in(store.list(f"{prefix}{ATTEMPTS_DIR}/"), prefix)
        number = (found[-1] if found else 0) + 1
        try:
            store.write_bytes(attempt_marker_key(prefix, number), record, if_absent=True)
            return number
        except PreconditionFailed:
            continue
    raise RuntimeError(f"could not claim an attempt number under {store.uri(prefix)}")


def _store_present(store: ObjectStore, job_dir_key: str) -> bool:
    """A local store is away while the job's dir (made at submit) is missing: writing
    then would recreate its root empty (remote.py waits before writing the result)."""
    return store.scheme != "file" or os.path.isdir(os.sep + job_dir_key)


def _seconds(env: str, default: float) -> float:
    try:
        value = float(os.environ.get(env) or default)
    except ValueError:
        log.warning("%s=%r is not a number: using %s", env, os.environ.get(env), default)
        return default
    return value if value > 0 else default


class Resume:
    """One run's attempt, start record and checkpoint directory (see the module doc)."""

    def __init__(self, result_uri: str, workdir: str, host: int) -> None:
        self.started_at = time.time()
        self.result_uri, self.host = result_uri, host
        self.attempt = 1
        self.local_dir = os.path.join(workdir, "checkpoint")
        self.sync: CheckpointSync | None = None
        self.interval = _seconds(SYNC_S_ENV, DEFAULT_SYNC_S)
        self.grace = _seconds(GRACE_S_ENV, DEFAULT_GRACE_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._restored = False

    # ---- 1. start -----------------------------------------------------------------
    def begin(self) -> None:
        """Claim the attempt and write the start record; PhaseError if the slot's
        attempts cannot be read or written (the attempt number would be a guess)."""
        store, result_key = store_for_uri(self.result_uri)
        job_dir = result_key.rsplit("/", 1)[0]
        present = _store_present(store, job_dir)
        uri = os.environ.get(CHECKPOINT_URI_ENV)
        if uri and present:
            try:
                ck_store, slot = store_for_uri(uri)
                prefix = host_key(slot, self.host)
                mark = {"started_at": self.started_at, "host": self.host, "job": job_dir}
                self.attempt = claim_attempt(ck_store, prefix, json.dumps(mark).encode())
            except Exception as exc:  # noqa: BLE001 - every setup failure is a payload
                raise PhaseError("checkpoint restore", exc) from exc
            self.sync = CheckpointSync(ck_store, prefix, self.local_dir, self.attempt)
        elif not uri:
            log.info("no %s: checkpoints last as long as this run", CHECKPOINT_URI_ENV)
        os.environ[ATTEMPT_ENV] = str(self.attempt)
        if not present:
            log.warning("the store is away: no start record, checkpoints not kept")
            return
        if self.host != 0:  # the leader's record is the job's; workers write nothing
            return
        record = started_record(self.started_at, self.host, self.attempt)
        try:  # the first start of this job stays (a restart of the same job keeps it)
            store.write_bytes(started_key(job_dir), record, if_absent=True)
        except PreconditionFailed:
            pass
        except Exception as exc:  # noqa: BLE001 - accounting only: the job still runs
            log.warning("could not write the start record: %s", exc)

    # ---- 2. restore and sync ------------------------------------------------------
    def restore(self) -> None:
        """The last snapshot into the local dir, the env for the function, and the
        periodic sync started; PhaseError("checkpoint restore") when it cannot be."""
        try:
            os.makedirs(self.local_dir, exist_ok=True)
            if self.sync is not None:
                count = self.sync.restore()
                log.info(
                    "attempt %d: restored %d checkpoint file(s); syncing every %gs",
                    self.attempt,
                    count,
                    self.interval,
                )
        except Exception as exc:  # noqa: BLE001 - every setup failure is a payload
            raise PhaseError("checkpoint restore", exc) from exc
        os.environ[CHECKPOINT_DIR_ENV] = self.local_dir
        os.environ[ATTEMPT_ENV] = str(self.attempt)
        self._restored = True
        if self.sync is not None:
            self._thread = threading.Thread(
                target=self._loop, name="kinetic-checkpoint-sync", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        assert self.sync is not None
        while not self._stop.wait(self.interval):
            try:
                self.sync.sync()
            except Exception as exc:  # noqa: BLE001 - a store hiccup: the next sync retries
                log.warning("checkpoint sync failed (retried in %gs): %s", self.interval, exc)
            if self.sync.superseded:
                return

    # ---- 3. the end -----------------------------------------------------------------
    def finish(self) -> None:
        """The function ended (either way): stop the periodic sync, sync once more.  A
        failure is logged, never the job's: its result is what the task waits for."""
        if not self._restored or self.sync is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.sync.sync()
        except Exception as exc:  # noqa: BLE001
            log.warning("the last checkpoint sync failed: %s", exc)
        stats = self.sync.stats
        log.info(
            "checkpoints: %d snapshot(s) published, %d file(s) / %d bytes uploaded",
            stats["published"],
            stats["uploaded_files"],
            stats["uploaded_bytes"],
        )

    def on_sigterm(self) -> None:
        """SIGTERM (a cancel, GKE's preemption notice): one last sync within the grace
        period, replaced objects left for the next attempt's restore to delete."""
        if not self._restored or self.sync is None:
            return
        self._stop.set()
        deadline = time.monotonic() + self.grace
        log.info("SIGTERM: saving checkpoints (up to %gs)", self.grace)
        try:
            done = self.sync.sync(deadline=deadline, hurry=True)
            log.info("SIGTERM: checkpoints %s", "saved" if done else "not saved")
        except Exception as exc:  # noqa: BLE001 - leaving anyway
            log.warning("SIGTERM: the last checkpoint sync failed: %s", exc)
