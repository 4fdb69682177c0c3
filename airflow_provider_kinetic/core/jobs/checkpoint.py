"""Where a task's checkpoints and a job's start record live: shared by the operator
side (env of the job, cleanup) and the runner (which reads and writes them).

A checkpoint must outlive the job that wrote it: a preempted job is resubmitted as a
new job (a new job id, a new ``{job_id}/`` dir), an Airflow retry or clear runs the
task again, and each must find what the last attempt saved.  So the store location is
stable per *task run* (dag id, run id, task id, map index: never the try number) and,
for a batch child, per input index (children of one batch never share one)::

    checkpoints/tasks/{dag}/{run}/{task}/{map_index}/   the task's checkpoints (cleanup)
        work/{work}/                                    one work's slots (the default,
                                                        ``checkpoint_restore="same_work"``)
        job/                                            a single job's slot
        inputs/{index}/                                 batch child ``index``'s slot
            host-{h}/                                   one host's files (multi-host: each)
                attempts/{n:06d}                        one marker per attempt that started
                manifest.json                           the last published snapshot
                files/{attempt}-{sync}/{path}           file contents (runner/checkpoint.py)

Checkpoints key on the work (``core.jobs.work``): with ``checkpoint_restore=
"same_work"`` (the default) the slots sit under ``work/{work}/``, ``{work}`` the first
32 hex digits of SHA-256 of the task's work digest, so a try that runs other work (the
function fixed, the inputs changed: a new batch) starts from an empty directory and
never restores another work's files; a preempted job of the same work, or a plain
retry, finds them.  ``checkpoint_restore="any"`` keeps one slot per task run whatever
the work (the layout of earlier versions, so their checkpoints are found): for a fix
that should go on from the old work's files.

A job without Airflow ids (plain Python) gets ``checkpoints/jobs/{job_id}/job/``: its
files persist only across restarts of that one job.  The two top-level kinds differ in
their first segment, so they never meet, and every id goes through ``key_part``.

The job learns its slot from ``KINETIC_CHECKPOINT_URI`` (``checkpoint_env``) and the
sync interval from ``KINETIC_CHECKPOINT_SYNC_S`` (only set when not the default, so a
manifest stays what it was for jobs that keep the default).

``started.json`` beside a job's result says when its runner started (usage accounting
reads it with :func:`read_started`).  Airflow-free, imports only spec and storage.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from airflow_provider_kinetic.core.spec.identity import key_part, task_key
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.core.storage.stat import stat_objects

#: The store URI of this job's checkpoint slot (the runner adds ``host-{h}/``).
CHECKPOINT_URI_ENV = "KINETIC_CHECKPOINT_URI"
#: Seconds between the runner's checkpoint syncs (default :data:`DEFAULT_SYNC_S`).
SYNC_S_ENV = "KINETIC_CHECKPOINT_SYNC_S"
#: What the function reads: the local directory whose files persist across attempts.
CHECKPOINT_DIR_ENV = "KINETIC_CHECKPOINT_DIR"
#: What the function reads: 1, 2, ... the attempts of this task run that started.
ATTEMPT_ENV = "KINETIC_ATTEMPT"
DEFAULT_SYNC_S = 60.0
#: ``checkpoint_restore``: restore only a checkpoint of the same work, or any.
RESTORE_SAME_WORK = "same_work"
RESTORE_ANY = "any"
RESTORE_CHOICES = (RESTORE_SAME_WORK, RESTORE_ANY)

ROOT = "checkpoints"
SINGLE_SLOT = "job"
ATTEMPTS_DIR = "attempts"
MANIFEST_NAME = "manifest.json"
FILES_DIR = "files"
#: The job's start record, in the job's own dir (beside ``result.pkl``).
STARTED_NAME = "started.json"


def has_task_ids(identity: Mapping[str, Any]) -> bool:
    """Whether ``identity`` names an Airflow task (plain Python jobs have none)."""
    return all(identity.get(k) not in (None, "") for k in ("dag_id", "run_id", "task_id"))


def task_checkpoints_key(identity: Mapping[str, Any]) -> str:
    """``checkpoints/tasks/{dag}/{run}/{task}/{map_index}/``: everything a task run's
    jobs (its single job or all its batch children) checkpointed."""
    return f"{ROOT}/tasks/{task_key(identity)}/"


def validate_restore(value: Any) -> str:
    """``checkpoint_restore`` as given; a ValueError naming it and the allowed values."""
    if value not in RESTORE_CHOICES:
        allowed = " or ".join(repr(c) for c in RESTORE_CHOICES)
        raise ValueError(f"checkpoint_restore must be {allowed}, got {value!r}")
    return str(value)


def work_slot(work: str | None, restore: str = RESTORE_SAME_WORK) -> str | None:
    """The work segment of a task's slots: None (one slot per task run) for ``any``
    or when the work is not known (a template of an earlier version)."""
    if validate_restore(restore) == RESTORE_ANY or not work:
        return None
    return hashlib.sha256(work.encode()).hexdigest()[:32]


def checkpoint_key(
    identity: Mapping[str, Any], job_id: str, index: int | None = None, work: str | None = None
) -> str:
    """The slot of one job (``index``: a batch child's input index; ``work``: the
    :func:`work_slot` segment), ending in ``/``."""
    if has_task_ids(identity):
        base = task_checkpoints_key(identity)
        if work:
            base += f"work/{key_part(work)}/"
    else:
        base = f"{ROOT}/jobs/{key_part(job_id)}/"
    return base + (SINGLE_SLOT if index is None else f"inputs/{int(index)}") + "/"


def host_key(slot_key: str, host: int) -> str:
    """One host's part of a slot (``host-{h}/``): hosts of a multi-host job each keep
    their own files (each writes its own shards) and count their own attempts."""
    return f"{slot_key.rstrip('/')}/host-{int(host)}/"


def attempt_marker_key(host_prefix: str, attempt: int) -> str:
    """The marker of attempt ``attempt`` (zero-padded: listings sort by number)."""
    return f"{host_prefix}{ATTEMPTS_DIR}/{int(attempt):06d}"


def attempts_in(keys: list[str], host_prefix: str) -> list[int]:
    """Attempt numbers of the markers among ``keys`` (a listing of the attempts dir)."""
    base = f"{host_prefix}{ATTEMPTS_DIR}/"
    return sorted(
        int(k[len(base) :]) for k in keys if k.startswith(base) and k[len(base) :].isdigit()
    )


def validate_sync_s(value: Any) -> float:
    """``checkpoint_sync_s`` as a float; a ValueError naming it unless finite and > 0
    (0 would sync in a busy loop, and a sync needs a full scan of the directory)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"checkpoint_sync_s must be a positive number of seconds, got {value!r}")
    return seconds


def checkpoint_env(
    store: ObjectStore,
    identity: Mapping[str, Any],
    job_id: str,
    index: int | None = None,
    sync_s: float = DEFAULT_SYNC_S,
    work: str | None = None,
) -> dict[str, str]:
    """The env a job needs to checkpoint: its slot's URI (``work``: see
    :func:`work_slot`), and the interval when not the default (the runner's default
    is the same constant)."""
    env = {CHECKPOINT_URI_ENV: store.uri(checkpoint_key(identity, job_id, index, work))}
    if validate_sync_s(sync_s) != DEFAULT_SYNC_S:
        env[SYNC_S_ENV] = repr(float(sync_s))
    return env


def remove_checkpoints(store: ObjectStore, identity: Mapping[str, Any]) -> int:
    """Delete a task run's checkpoints (all slots and hosts); returns objects deleted.

    For when the task succeeded as a whole and the cleanup policy deletes artifacts:
    never after a failure (a retry resumes from them).  0 for a job without task ids.
    """
    if not has_task_ids(identity):
        return 0
    return store.delete_prefix(task_checkpoints_key(identity))


# ---- the start record -------------------------------------------------------------


def started_key(job_dir_key: str) -> str:
    """``{job dir}/started.json``: written by host 0 only (a multi-host job's hosts
    start together, and a worker host writes nothing into the job's dir)."""
    return f"{job_dir_key.rstrip('/')}/{STARTED_NAME}"


def started_record(started_at: float, host: int, attempt: int) -> bytes:
    """The start record's bytes: ``{"started_at": epoch s, "host": h, "attempt": n}``."""
    return json.dumps({"started_at": started_at, "host": host, "attempt": attempt}).encode()


def read_started(store: ObjectStore, job_dir_key: str) -> dict[str, Any] | None:
    """When the job's runner first started (``started_at``, epoch seconds), on which
    host and as which attempt; None when it never started (or wrote no record: a job of
    kinetic's own runner).  A restart of the same job keeps the first record."""
    try:
        value = json.loads(store.read_bytes(started_key(job_dir_key)))
    except (ObjectNotFound, ValueError):  # none, or not ours to read
        return None
    return value if isinstance(value, dict) else None


def stale_checkpoints(
    store: ObjectStore, older_than_s: float, now: float
) -> list[tuple[str, int, int]]:
    """``(prefix, objects, bytes)`` of each task run's (or plain job's) checkpoints
    whose newest write is older than ``older_than_s``: what the retention of failed
    work (``jobs cleanup``) deletes.  A task that succeeds deletes its own at once
    under ``on_success`` / ``always``; these are the ones a failed task left for a
    retry that never came."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for key, found in stat_objects(store, f"{ROOT}/").items():
        parts = key.split("/")
        depth = 6 if parts[1:2] == ["tasks"] else 3  # checkpoints/tasks/d/r/t/m | jobs/id
        if len(parts) > depth:
            groups.setdefault("/".join(parts[:depth]) + "/", []).append(found)
    return [
        (prefix, len(objects), sum(size for size, _ in objects))
        for prefix, objects in sorted(groups.items())
        if now - max(when for _, when in objects) > older_than_s
    ]
