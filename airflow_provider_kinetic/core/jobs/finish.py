"""Finishing one ended job, the same from the operator's try and the job sensor
(``core.batch.finish`` is a batch's; ``core.jobs.cleanup`` is the policy).

``attach(job).cleanup()`` is not a finish: ``jobs cleanup`` deletes with it what
retention says, batch children included, which have no history entry of their own.

One order, whoever finishes the job:

1. its result is read and verified (unless the caller does not want its value);
2. the value is delivered (``deliver``: the caller's XCom push and task record),
   before anything of the job is deleted;
3. its history entry says how it ended (CANCELLED when someone asked for that);
4. the cleanup policy: usage recorded, log archived, backend state released,
   artifacts by policy (a result an XCom reference points at is kept);
5. its Job / LeaderWorkerSet is deleted, whatever the outcome (a LeaderWorkerSet
   has no TTL; a failed job may hold a stuck pod);
6. with ``checkpoints_of`` (a task's identity): the task's checkpoints, once its
   value is delivered and the policy deletes a succeeded job's artifacts.

With ``hold`` (an operator's try, whose record says "delivered" at step 2) the
artifacts the policy would delete at step 4 are kept (history: "held") until the
caller's record says the try returned the value (:func:`release_held`): a try ended
in between (Airflow terminating it) leaves a later try the same value to collect.

A job that succeeded but whose result cannot be read (the store, a key) keeps its
artifacts and history says "not collected": a retry collects it, nothing runs twice.
Whatever needs Airflow (the XCom push, the task's usage line) is the caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import remove_checkpoints
from airflow_provider_kinetic.core.jobs.classify import classify
from airflow_provider_kinetic.core.jobs.cleanup import after_job, deletes, left_behind
from airflow_provider_kinetic.core.jobs.resultref import result_ref_uris
from airflow_provider_kinetic.core.jobs.results import collect_with_blob
from airflow_provider_kinetic.core.jobs.taskrecord import cancel_requested
from airflow_provider_kinetic.core.spec.failure import Failure
from airflow_provider_kinetic.core.spec.handles import (
    JobHandle,
    JobStatus,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)


def describe_failure(exc: BaseException) -> str:
    """``Type: message`` of a job's failure; the remote type when the exception could
    not be rebuilt here (``RemoteFunctionError.remote_type``, already in its message)."""
    if getattr(exc, "remote_type", None):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@dataclass
class FinishedJob:
    """How a job was finished."""

    handle: JobHandle
    report: StatusReport
    #: What was delivered (``deliver``'s answer; the value itself without one); None
    #: when the value was not read or the job has none.
    value: Any = None
    #: Why the job has no value: its remote exception, or a result that could not be
    #: read.  None: it succeeded, or its result was not read.
    error: Exception | None = None
    #: Whether its result was read (``read_value``).
    read: bool = False
    #: Artifact objects the policy deleted.
    removed: int = 0
    #: The policy deletes its artifacts, but they are kept until ``release_held``.
    held: bool = False
    #: What failed (class, phase, host), when ``error`` is set.
    classified: Failure | None = None

    @property
    def succeeded(self) -> bool:
        """Its result says so (a job whose backend state is gone may have one); unread,
        its status."""
        if self.error is not None:
            return False
        return self.read or self.report.status is JobStatus.SUCCEEDED

    @property
    def failure(self) -> str | None:
        """The error as history and the task's exception name it."""
        return describe_failure(self.error) if self.error is not None else None


def finish_job(
    store: ObjectStore,
    backend: Backend,
    handle: JobHandle,
    report: StatusReport,
    *,
    cleanup: str,
    result_key: str | None,
    read_value: bool = True,
    deliver: Callable[[Any, bytes], Any] | None = None,
    checkpoints_of: Mapping[str, Any] | None = None,
    hold: bool = False,
    keep_result: bool = False,
    log_: Any = None,
    infra_exit_codes: Collection[int] = (),
) -> FinishedJob:
    """Finish an ended job (``report``: how it ended) in the order above.

    ``cleanup``: the cleanup policy (``on_success`` | ``always`` | ``never``);
    ``result_key``: the job's result key;
    ``read_value=False``: its result is not read (nobody wants the value); ``deliver``
    (value, verified ``result.pkl`` bytes) -> what was delivered, called for a job
    that succeeded before anything is deleted (if it raises, the job is left as it
    is).  ``hold``: a delivered value's artifacts are kept until ``release_held``.
    ``keep_result``: a succeeded job's artifacts stay whatever the policy (``cache=True``:
    a cache entry will hold its result, ``core.jobs.resultcache``).
    The job's failure is returned (``FinishedJob.error``, and what failed:
    ``FinishedJob.classified``), not raised: the caller raises it its own way, after
    what it still has to do.  ``infra_exit_codes``: exit codes that count as infra."""
    logger = log_ or log
    done = FinishedJob(handle, report, read=read_value)
    value, blob = None, b""
    if read_value:
        failed: list[dict] = []
        try:
            value, blob = collect_with_blob(
                store,
                handle.job_id,
                report.status,
                report.reason,
                result_key=result_key,
                failed=failed,
            )
        except Exception as exc:
            done.error = exc
            done.classified = classify_ended(
                store, handle, report, failed, exc, infra_exit_codes=infra_exit_codes
            )
            _show_host_log(backend, handle, done.classified.host_index, logger)
            tb = next((n for n in getattr(exc, "__notes__", []) if n.startswith("Remote")), None)
            logger.error(
                "kinetic job %s failed: %s: %s%s",
                handle.job_id,
                type(exc).__name__,
                exc,
                "\n" + tb if tb else "",
            )
    if read_value and done.succeeded:
        done.value = deliver(value, blob) if deliver is not None else value
    try:  # its log archived before the Job (and its pods) go
        _record_end(store, backend, done, cleanup, logger, hold, keep_result)
    finally:
        _delete_job(backend, handle, logger)
    if checkpoints_of is not None and done.succeeded and deletes(cleanup, True):
        try:  # done for good: nothing will resume from them
            remove_checkpoints(store, checkpoints_of)
        except Exception as exc:  # noqa: BLE001 - the value is delivered already
            logger.warning("could not delete the task's checkpoints: %s", exc)
    return done


#: The failing host's last log lines shown in the task log (its pods go at the finish).
HOST_LOG_LINES = 50


def _show_host_log(backend: Backend, handle: JobHandle, host: int | None, logger: Any) -> None:
    """A failing worker's own log tail (a multi-host job's log is its leader's)."""
    if not host:
        return
    try:
        text = backend.read_host_log(handle, host, HOST_LOG_LINES)
    except Exception as exc:  # noqa: BLE001 - the failure is reported either way
        logger.warning("could not read host %d's log of job %s: %s", host, handle.job_id, exc)
        return
    for line in (text or "").splitlines():
        logger.info("[%s host %d] %s", handle.job_id, host, line)


def host_count(handle: JobHandle) -> int:
    """How many hosts the job spans: its accelerator's, times its slices (1 when it
    cannot be read)."""
    try:
        return parse_accelerator(handle.accelerator or "cpu").num_nodes * (handle.num_slices or 1)
    except Exception:  # noqa: BLE001 - an accelerator from another version: one host
        return 1


def classify_ended(
    store: ObjectStore,
    handle: JobHandle,
    report: StatusReport,
    failed: list[dict],
    error: BaseException | None = None,
    *,
    infra_exit_codes: Collection[int] = (),
) -> Failure:
    """What failed in ``handle`` (``core.jobs.classify``), from the failure payloads
    its hosts wrote (``failed``: lowest failing host first, as ``collect`` found them)."""
    payload = min(failed, key=lambda p: int(p.get("host_index") or 0)) if failed else None
    try:
        cancelled = cancel_requested(store, handle)
    except Exception:  # noqa: BLE001 - an unreadable store: not known to be cancelled
        cancelled = False
    return classify(
        handle.job_id,
        report,
        payload,
        failed_hosts=[int(p.get("host_index") or 0) for p in failed],
        host_count=host_count(handle),
        cancelled=cancelled and payload is None,
        error=error,
        infra_exit_codes=infra_exit_codes,
    )


def failure_of(
    store: ObjectStore,
    handle: JobHandle,
    report: StatusReport,
    result_key: str | None,
    infra_exit_codes: Collection[int] = (),
) -> Failure | None:
    """What failed in an ended job (its result read and verified, nothing delivered
    or deleted), or None: it left a good result after all."""
    failed: list[dict] = []
    try:
        collect_with_blob(
            store, handle.job_id, report.status, report.reason, result_key=result_key, failed=failed
        )
    except Exception as exc:  # noqa: BLE001 - every failure is classified
        return classify_ended(store, handle, report, failed, exc, infra_exit_codes=infra_exit_codes)
    return None


def _record_end(
    store: ObjectStore,
    backend: Backend,
    done: FinishedJob,
    cleanup: str,
    logger: Any,
    hold: bool,
    keep_result: bool = False,
) -> None:
    """History, then the cleanup policy.  A job that succeeded but whose result could
    not be read is left exactly as it is: a retry collects it, nothing runs twice.
    ``hold``: a delivered value's artifacts stay (``release_held`` deletes them)."""
    handle, report, failure = done.handle, done.report, done.failure
    state, reason = report.status.value, report.reason
    if done.read and failure is None and report.status is JobStatus.NOT_FOUND:
        state, reason = JobStatus.SUCCEEDED.value, None  # its result says so; the job is gone
    if done.read and failure is None and report.status is JobStatus.FAILED:
        # Its function returned a whole result; the platform failed the pod afterwards.
        why = f"{state} ({reason})" if reason else state
        state, reason = (
            JobStatus.SUCCEEDED.value,
            f"the pod ended {why} after the function returned",
        )
    if failure is not None and cancel_requested(store, handle):
        state = history.CANCELLED  # stopped on purpose: not the function's failure
    if failure is not None and report.status is JobStatus.SUCCEEDED:
        what = {"failure": done.classified.to_dict()} if done.classified is not None else {}
        history.update(store, handle.job_id, state, f"not collected: {failure}", **what)
        return
    extra = {"failure": done.classified.to_dict()} if done.classified is not None else {}
    history.update(store, handle.job_id, state, failure or reason, **extra)
    kept = result_ref_uris(done.value)
    result = store.uri(artifact_key(handle.job_id, "result.pkl"))
    cached = keep_result and done.read and done.succeeded
    if cached:
        kept.add(result)
    done.held = hold and done.read and done.succeeded and deletes(cleanup, True)
    done.held = done.held and result not in kept  # a referenced result stays anyway
    done.removed = after_job(
        store,
        backend,
        [handle],
        succeeded=done.succeeded,
        cleanup=cleanup,
        kept_uris=kept | ({result} if done.held else set()),
        log_=logger,
        archive_logs=True,
    )
    if done.held:
        _note_artifacts(store, handle.job_id, cleanup, HELD)
    elif cached:
        _note_artifacts(store, handle.job_id, cleanup, CACHED)


#: History's word for a cached job's artifacts (``core.jobs.resultcache``).
CACHED = "kept: a cache entry holds its result ([kinetic] cache_retention_days)"
#: History's word for a delivered job's artifacts kept until its try has returned.
HELD = "held: the value is delivered; kept until the task's try has returned it"


def release_held(store: ObjectStore, done: FinishedJob, cleanup: str, log_: Any = None) -> None:
    """Delete the artifacts ``finish_job(hold=True)`` kept, once the caller's record
    says the value was returned (never fatal: the value is home; ``jobs cleanup``
    deletes what is left)."""
    if not done.held:
        return
    job_id = done.handle.job_id
    try:
        done.removed += store.delete_prefix(f"{job_id}/")
        _note_artifacts(store, job_id, cleanup, "deleted")
        done.held = False
    except Exception as exc:  # noqa: BLE001 - the value is home already
        (log_ or log).warning("could not delete the artifacts of job %s: %s", job_id, exc)


def _note_artifacts(store: ObjectStore, job_id: str, cleanup: str, state: str) -> None:
    """The history entry's ``artifacts`` (as ``core.jobs.cleanup`` writes it)."""
    history.update(
        store, job_id, artifacts={"state": state, **left_behind(store, job_id), "policy": cleanup}
    )


def _delete_job(backend: Backend, handle: JobHandle, logger: Any) -> None:
    """The ended job's Job / LeaderWorkerSet goes now, whatever the outcome."""
    try:
        backend.cancel(handle)
    except Exception as exc:  # noqa: BLE001 - keep the job's own outcome
        logger.warning("could not delete job %s: %s", handle.job_id, exc)
