"""The one cleanup policy: what an ended job leaves in the store and on disk.

Every path that ends a job (sync, deferred, the sensor, batches, failures, cancels)
calls :func:`after_job`, so they all leave the same thing:

- the backend's own state goes once the outcome is collected, whatever the policy
  (the cluster's Job / LeaderWorkerSet, the local backend's ``.local-jobs/{id}`` and
  its temp dir), the local log archived in the history first;
- the job's artifacts (``{job_id}/``: payload, handle, result, markers) go by policy:
  ``on_success`` (the default) deletes them once a succeeded job's value is delivered
  and keeps a failed job's for ``[kinetic] failed_retention_days`` (``jobs cleanup``
  deletes them after that); ``always`` deletes them however the job ended; ``never``
  keeps them until ``jobs cleanup`` is asked.  A result that an XCom reference points
  at is never deleted here: its value lives only there;
- outputs, the data cache and the history are never touched.

The history entry says which of these happened and how much was left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.jobs import history, usage
from airflow_provider_kinetic.core.spec.handles import JobHandle, artifact_key
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.stat import stat_objects

log = logging.getLogger(__name__)

ON_SUCCESS = "on_success"
ALWAYS = "always"
NEVER = "never"
POLICIES = (ON_SUCCESS, ALWAYS, NEVER)
DEFAULT_POLICY = ON_SUCCESS
#: Default of ``[kinetic] failed_retention_days``.
FAILED_RETENTION_DAYS = 7.0
#: The most of one local job's log the history keeps (its end).
LOG_ARCHIVE_BYTES = 8 * 1024 * 1024


def policy(value: Any) -> str:
    """``value`` as one of :data:`POLICIES`; a ValueError naming the bad value and what
    is allowed otherwise."""
    if isinstance(value, str) and value in POLICIES:
        return value
    raise ValueError(f"cleanup={value!r}: allowed values are {', '.join(map(repr, POLICIES))}")


def deletes(cleanup: str, succeeded: bool) -> bool:
    """Whether ``cleanup`` deletes the artifacts of a job that ended this way."""
    return cleanup == ALWAYS or (cleanup == ON_SUCCESS and succeeded)


def release(
    store: ObjectStore,
    backend: Backend,
    handles: Iterable[JobHandle],
    archive_logs: bool | None = None,
) -> None:
    """Archive each ended job's log (by default where the backend does not keep it;
    ``archive_logs=True``: a single job's pod log too, before its Job is deleted), then
    let the backend remove its state (never fatal: the outcome is already collected)."""
    archive = not backend.keeps_logs if archive_logs is None else archive_logs
    for handle in handles:
        try:
            if archive:
                text = backend.read_logs(handle, 0)[0]
                if text:
                    history.archive_log(store, handle.job_id, text, LOG_ARCHIVE_BYTES)
            backend.release(handle)
        except Exception as exc:  # noqa: BLE001 - the value is delivered; say, go on
            log.warning("could not release kinetic job %s: %s", handle.job_id, exc)


def left_behind(store: ObjectStore, job_id: str) -> dict[str, int]:
    """Objects and bytes still under ``{job_id}/``."""
    sizes = stat_objects(store, f"{job_id}/")
    return {"objects": len(sizes), "bytes": sum(size for size, _ in sizes.values())}


def after_job(
    store: ObjectStore,
    backend: Backend,
    handles: list[JobHandle],
    *,
    succeeded: bool | set[str],
    cleanup: str,
    kept_uris: Iterable[str] = (),
    entry_id: str | None = None,
    log_: Any = None,
    archive_logs: bool | None = None,
) -> int:
    """Apply the policy to ended jobs (one, or a batch's children) whose outcome was
    collected; update the history entry (``entry_id``: the batch's, else each job's).
    ``succeeded``: how they all ended, or the ids of those that succeeded;
    ``archive_logs`` as for :func:`release` (a batch's children on a cluster stay in its
    logging, one read per child would be too many).  Returns how many artifact objects
    were deleted."""
    logger = log_ or log
    # What each job held and for how long, read from its start record and result
    # before the policy may delete them (``core.jobs.usage``).
    for job_id in [entry_id] if entry_id is not None else [h.job_id for h in handles]:
        usage.record_usage(store, job_id)
    # A debug job's pod stays for its TTL (two hours): a debugger may still be looking
    # at it, and its log with it (``jobs cleanup`` releases it sooner).
    kept_pods = [h for h in handles if h.debug and backend.keeps_logs]
    for handle in kept_pods:
        logger.info("kinetic debug job %s: its pod stays until its TTL expires", handle.job_id)
    release(store, backend, [h for h in handles if h not in kept_pods], archive_logs)
    kept = set(kept_uris)
    removed, left = 0, {"objects": 0, "bytes": 0}
    any_referenced = False
    for handle in handles:
        ok = succeeded if isinstance(succeeded, bool) else handle.job_id in succeeded
        referenced = store.uri(artifact_key(handle.job_id, "result.pkl")) in kept
        any_referenced = any_referenced or referenced
        if deletes(cleanup, ok) and not referenced:
            removed += store.delete_prefix(f"{handle.job_id}/")
            here = {"objects": 0, "bytes": 0}
        else:
            here = left_behind(store, handle.job_id)
        left = {k: left[k] + here[k] for k in left}
        if entry_id is None:
            _note(store, handle.job_id, cleanup, here, referenced)
    if entry_id is not None:
        _note(store, entry_id, cleanup, left, any_referenced, whose="its failed child jobs")
    if removed:
        logger.info(
            "cleanup (%s): deleted %d artifact object(s) of %d job(s)",
            cleanup,
            removed,
            len(handles),
        )
    return removed


def _note(
    store: ObjectStore,
    job_id: str,
    cleanup: str,
    left: dict[str, int],
    referenced: bool,
    whose: str = "the job failed",
) -> None:
    if not left["objects"]:
        why = "deleted"
    elif referenced:
        why = "kept: an XCom result reference points at a result"
    elif cleanup == NEVER:
        why = "kept: cleanup='never'"
    else:
        why = f"kept: {whose} ([kinetic] failed_retention_days)"
    history.update(store, job_id, artifacts={"state": why, **left, "policy": cleanup})
