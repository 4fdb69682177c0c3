"""One rule for every try of a task: find the task's job, then adopt, collect or submit.

A task's job identity survives its tries in a small record in the store, keyed by the
task's identity (dag, run, task, map index) so any try on any worker finds it, on every
Airflow version.  The record is sealed with the deployment secret (``core.jobs.signing``):
the store is shared, and a forged record must not make a worker adopt someone else's
job.  A record that fails its seal (altered, or sealed with a key that has left the
keyring) fails the try with an error naming the key: ignoring it ran its job twice.
What the next try does is read from real state, never from memory:

==========================================  =========================================
job found for this task                     the new try
==========================================  =========================================
none, or its result was delivered and the   submit (a clear of a finished task re-runs)
try that delivered it returned
delivered, but its try ended before it      collect: the same value again, kept for it
returned (a termination while finishing)      (the same rows below: never a second run)
PENDING / RUNNING                            adopt and wait
PENDING / RUNNING, but cancel requested,    submit anew (a clear or mark-failed of a
or owned by a deferred try that ended          deferred task: "run it again"; the old
from outside                                   job is cancelled first)
SUCCEEDED (or gone with a good result)      collect, no new job
FAILED / cancelled / gone                   submit anew
named, never created (its try stopped       submit anew; its upload is removed, it is
before its create returned)                   no attempt and gets no history entry
==========================================  =========================================

A job is adopted or collected only when it runs the same work as the new try
(``core.jobs.work``: code, inputs, options).  Other work (the function was fixed and
the task cleared, the inputs changed) is never adopted: a live job is cancelled, a
finished one is not collected, the old record is kept under ``superseded/`` for
history, and the new work is submitted.  Records written before work digests existed
compare nothing (the table alone applies).

Records live at ``_airflow/tasks/{dag}/{run}/{task}/{map_index}.json`` with each part
as ``core.spec.identity.key_part`` makes it (distinct ids, distinct keys) and keep the
exact ids.

A deferred try never ends while its job still runs: its trigger fires only for a
terminal job, a timeout, or an error the operator turns into a cancel.  So a live job
owned by a deferred try means the try was killed from outside (user clear or
mark-failed), where a new try must not adopt it.  A live job owned by a sync try means
the worker died (SIGKILL, OOM), where adopting avoids running the job twice.  So the
record says DEFERRED only from the moment the try hands its job to the triggerer; a
deferrable try watching its job in the worker first (``defer_grace_s``) says SYNC.

What the record says of the value: ``delivered`` once it is in XCom (the try may still
be finishing; its job's artifacts are kept), ``returned`` once that try handed it back
to Airflow (only then do the artifacts go).  A later try of a delivered record that was
never returned collects the same value again; of a returned one, it is a clear.  A
trigger that ends its task itself (``triggers.end_task``) writes both at once, with
the XComs it hands Airflow in the record (``xcoms``), before the artifacts go.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.results import read_result
from airflow_provider_kinetic.core.jobs.signing import (
    ResultAuthError,
    SigningKeyChanged,
    seal,
    unseal,
)
from airflow_provider_kinetic.core.spec.handles import (
    JobHandle,
    JobStatus,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.core.spec.identity import exact_identity, task_key
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

RECORDS_PREFIX = "_airflow/tasks"
CANCEL_MARKER = "cancel-requested"
SYNC, DEFERRED = "sync", "deferred"
SUPERSEDED = "superseded"


class Step(enum.Enum):
    SUBMIT = "submit"
    ADOPT = "adopt"
    COLLECT = "collect"


@dataclass
class TaskRecord:
    """Which job (or batch) a task's tries work on, and how the latest try waited."""

    kind: str  # "job" | "batch"
    mode: str  # SYNC | DEFERRED: how the try that wrote it waits
    try_number: int | None = None
    handle: dict[str, Any] | None = None
    group_id: str | None = None
    #: The job's value is in XCom (the try that pushed it may still be finishing).
    delivered: bool = False
    #: The try that delivered the value returned it to Airflow: nothing of that try is
    #: left to do, so a later try of this record is a clear ("run it again").
    returned: bool = False
    #: Preemptions (spot reclaim, a node shut down) resubmitted so far, across tries.
    preemptions: int = 0
    #: Re-submits so far per failure class (``retry_on``), across tries; preemptions
    #: are counted here and in ``preemptions``.
    resubmits: dict[str, int] = field(default_factory=dict)
    #: ``core.jobs.work`` digest of what the job (or batch) runs; None: not known.
    work: str | None = None
    #: The task's exact ids (dag_id, run_id, task_id, map_index), for history listings.
    identity: dict[str, Any] | None = None
    #: Every job id this task run's work has had (preemption re-submits, capacity
    #: steps, tries), oldest first: what its usage sums (``core.jobs.usage``).
    attempts: list[str] = field(default_factory=list)
    #: The XComs a trigger ended the task with (``triggers.end_task``): the record holds
    #: the value from the moment the job's artifacts go until Airflow has it, so a
    #: trigger of the same try re-created after its event was lost hands the same
    #: XComs again (never a second run).  None: the value went through a worker.
    xcoms: dict[str, Any] | None = None

    @property
    def job(self) -> JobHandle | None:
        return JobHandle.from_dict(self.handle) if self.handle else None


def record_key(identity: Mapping[str, Any]) -> str:
    return f"{RECORDS_PREFIX}/{task_key(identity)}.json"


class UnverifiedRecord(ResultAuthError):
    """A task record is there but cannot be verified (a signing key that left the ring,
    an altered record): the try fails instead of ignoring it, which would run the job
    the record names a second time."""


def _read_at(store: ObjectStore, key: str, secret: bytes) -> TaskRecord | None:
    try:
        blob = store.read_bytes(key)
    except ObjectNotFound:
        return None
    try:
        fields = unseal(secret, blob, store.uri(key))
        known = TaskRecord.__dataclass_fields__
        return TaskRecord(**{k: v for k, v in fields.items() if k in known})
    except (ResultAuthError, TypeError) as exc:
        raise UnverifiedRecord(
            f"{exc}. This task record names the job an earlier try ran, so this try does "
            "not run the function again (that could run it twice): make the record "
            f"readable again, or delete {store.uri(key)} to run the task anew"
        ) from exc


def read_record(
    store: ObjectStore, identity: Mapping[str, Any], secret: bytes
) -> TaskRecord | None:
    """The task's record, or None (none yet); ``UnverifiedRecord`` for one that fails
    its seal (never ignored: that would run its job again)."""
    return _read_at(store, record_key(identity), secret)


def write_record(
    store: ObjectStore, identity: Mapping[str, Any], record: TaskRecord, secret: bytes
) -> None:
    record.identity = exact_identity(identity)
    store.write_bytes(
        record_key(identity), seal(secret, asdict(record)), content_type="application/json"
    )


def supersede_record(
    store: ObjectStore, identity: Mapping[str, Any], record: TaskRecord, secret: bytes
) -> str:
    """Keep ``record`` for history before a new try replaces it (its job is listed with
    its task afterwards); returns the key it went to."""
    name = (record.job.job_id if record.job is not None else record.group_id) or "unknown"
    key = f"{RECORDS_PREFIX}/{task_key(identity)}/{SUPERSEDED}/{name}.json"
    record.identity = record.identity or exact_identity(identity)
    store.write_bytes(key, seal(secret, asdict(record)), content_type="application/json")
    return key


def request_cancel(store: ObjectStore, backend: Backend, handle: JobHandle) -> None:
    """Cancel a job so that no later try adopts it: the marker first, then the cancel."""
    store.write_bytes(artifact_key(handle.job_id, CANCEL_MARKER), b"")
    # Before the cancel: whoever collects the job after it stops writes the last word.
    # A batch child has no entry of its own (its batch's says how it ended).
    create = handle.group_id is None
    history.update(store, handle.job_id, history.CANCELLED, "cancel requested", create=create)
    backend.cancel(handle)


def cancel_requested(store: ObjectStore, handle: JobHandle) -> bool:
    return store.exists(artifact_key(handle.job_id, CANCEL_MARKER))


def succeeded_result(
    store: ObjectStore, handle: JobHandle, result_key: Callable[[JobHandle], str | None]
) -> bool:
    """Whether the job left an authentic success payload (its pod may be gone)."""
    try:
        payload = read_result(store, handle.job_id, (0,), result_key(handle))
    except SigningKeyChanged:
        raise  # a real result this deployment can no longer read: never run it again
    except Exception as exc:  # noqa: BLE001 - unreadable or forged: not a result
        log.warning("result of job %s is not usable: %s", handle.job_id, exc)
        return False
    return bool(payload and payload.get("success"))


def other_work(record: TaskRecord, work: str | None) -> bool:
    """Whether ``record`` names work other than ``work`` (unknown on either side: no)."""
    return work is not None and record.work is not None and record.work != work


def never_created(store: ObjectStore, job: JobHandle, seen: StatusReport) -> bool:
    """Whether the record's job is one its try named and never created: the record
    still holds the provisional handle (no ``created_at``: the try stopped before its
    create returned), the backend does not know it, it left no result, and it has no
    history entry (written once the create returned).  Only what its upload left
    (``payload.pkl``, and ``handle.json`` when the try stopped in the create) is there."""
    return (
        not job.created_at
        and seen.status is JobStatus.NOT_FOUND
        and history.read(store, job.job_id) is None
        and not store.exists(artifact_key(job.job_id, "result.pkl"))
    )


def decide_job(
    record: TaskRecord | None,
    backend: Backend,
    store: ObjectStore,
    result_key: Callable[[JobHandle], str | None] = lambda _handle: None,
    work: str | None = None,
) -> tuple[Step, JobHandle | None, StatusReport | None, str]:
    """Apply the table above to a single job: (step, the old job, its status, why).

    ``work``: the new try's work digest; a job of other work is never adopted or
    collected (a live one is cancelled)."""
    job = record.job if record is not None else None
    if record is None or job is None:
        return Step.SUBMIT, None, None, "no earlier job for this task"
    if record.delivered and record.returned:
        return Step.SUBMIT, job, None, f"job {job.job_id} already delivered its result: run again"
    seen = backend.status(job)
    if never_created(store, job, seen):
        why = f"job {job.job_id} was never created (its try stopped before its create"
        return Step.SUBMIT, job, seen, why + " returned): running it"
    report = history.settled(store, job.job_id, seen)  # released: its history
    released = seen.status is JobStatus.NOT_FOUND  # what says how it ended: the history
    live = report.status in (JobStatus.PENDING, JobStatus.RUNNING)
    if live and cancel_requested(store, job):
        return Step.SUBMIT, job, report, f"job {job.job_id} is being cancelled"
    if other_work(record, work):
        why = f"job {job.job_id} ({report.status.value}) ran other work than this try's"
        why += " (its code, inputs or options changed since)"
        if live:
            request_cancel(store, backend, job)
            return Step.SUBMIT, job, report, why + ": cancelled it, running the new work"
        return Step.SUBMIT, job, report, why + ": not collecting it, running the new work"
    if live and record.mode == DEFERRED:
        request_cancel(store, backend, job)
        why = f"job {job.job_id} belonged to a deferred try that was cleared or marked failed"
        return Step.SUBMIT, job, report, why + ": cancelled it, running again"
    if live:
        return Step.ADOPT, job, report, f"job {job.job_id} is still {report.status.value}"
    if (report.status is JobStatus.SUCCEEDED and not released) or (
        released
        and report.status in (JobStatus.SUCCEEDED, JobStatus.NOT_FOUND)
        and succeeded_result(store, job, result_key)
    ):
        if record.delivered:  # its try ended between the XCom push and its return
            why = f"job {job.job_id} delivered its result to a try that ended before returning"
            return Step.COLLECT, job, report, why + " it; collecting the same result again"
        return Step.COLLECT, job, report, f"job {job.job_id} finished; collecting its result"
    if report.status is JobStatus.SUCCEEDED:  # released, and its result is gone
        why = f"job {job.job_id} succeeded, but its result is gone (cleaned up): running again"
        return Step.SUBMIT, job, report, why
    return Step.SUBMIT, job, report, f"job {job.job_id} ended {report.describe()}"
