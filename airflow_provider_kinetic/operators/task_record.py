"""The task's record as a KineticRunOperator try keeps it (``core.jobs.taskrecord``).

Every try keeps a record of its job in the store, written *before* the job is
created, so a later try finds the job instead of running it twice.  The record also
counts the task's re-submits per failure class (``retry_on``, ``preemption_retries``),
which do not use the task's Airflow ``retries``.  Airflow 3.3's task state store holds the job too:
a fallback when the store has no record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.jobs.taskrecord import SYNC, TaskRecord, read_record, record_key
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.operators.common import XCOM_JOB


def preemptions_of(record: TaskRecord | None) -> int:
    return record.preemptions if record is not None and record.kind == "job" else 0


def resubmits_of(record: TaskRecord | None) -> dict[str, int]:
    """Re-submits so far per failure class (a record from before classes: its
    preemptions)."""
    if record is None or record.kind != "job":
        return {}
    counts = dict(record.resubmits or {})
    if record.preemptions:
        counts["preemption"] = max(counts.get("preemption", 0), record.preemptions)
    return counts


def load_record(
    store: ObjectStore, identity: dict[str, Any], secret: bytes, context: Any
) -> TaskRecord | None:
    """The task's record in the store; Airflow 3.3's task state store as a fallback."""
    record = read_record(store, identity, secret)
    if record is not None:
        return record
    state = context.get("task_state_store")
    try:
        previous = state.get(XCOM_JOB) if state is not None else None
    except Exception:  # noqa: BLE001 - an unreadable state store means "nothing found"
        previous = None
    if isinstance(previous, dict) and previous.get("job_id"):
        return TaskRecord(kind="job", mode=SYNC, handle=previous)
    return None


def next_record(
    old: TaskRecord | None,
    handle: JobHandle,
    *,
    mode: str,
    try_number: int | None,
    work: str | None,
    delivered: bool,
    returned: bool = False,
    preemptions: int | None,
    resubmits: dict[str, int] | None = None,
) -> TaskRecord:
    """The record after ``old`` for ``handle``: its work digest (``work``, else the
    record's for the same job: a resumed deferred try has not planned), the task's
    preemptions (``old``'s unless given) and every job its run has had."""
    if preemptions is None:
        preemptions = preemptions_of(old)
    if resubmits is None:
        resubmits = resubmits_of(old)
    if work is None and old is not None and old.job and old.job.job_id == handle.job_id:
        work = old.work
    attempts = list(old.attempts) if old is not None and old.kind == "job" else []
    if handle.job_id not in attempts:
        attempts.append(handle.job_id)
    return TaskRecord(
        kind="job",
        mode=mode,
        try_number=try_number,
        handle=handle.to_dict(),
        delivered=delivered,
        returned=returned,
        preemptions=preemptions,
        resubmits=dict(resubmits),
        work=work,
        attempts=attempts,
    )


def note_in_state_store(context: Any, handle: JobHandle, log: Any) -> None:
    state = context.get("task_state_store")
    if state is None:
        return
    try:
        state.set(XCOM_JOB, handle.to_dict())
    except Exception as exc:  # noqa: BLE001 - the store record is what counts
        log.warning("could not record the job in the task state store: %s", exc)


@dataclass
class StoredRecord:
    """The task's record as stored (its sealed bytes), its task state store entry and
    the record the try held: what a rejected submit puts back."""

    sealed: bytes | None
    state_entry: Any
    record: TaskRecord | None


def stored_record(
    store: ObjectStore, identity: dict[str, Any], context: Any, held: TaskRecord | None
) -> StoredRecord:
    try:
        sealed: bytes | None = store.read_bytes(record_key(identity))
    except ObjectNotFound:
        sealed = None
    state = context.get("task_state_store")
    try:
        previous = state.get(XCOM_JOB) if state is not None else None
    except Exception:  # noqa: BLE001 - an unreadable state store holds nothing of ours
        previous = None
    return StoredRecord(sealed, previous, held)


def restore_record(
    store: ObjectStore, identity: dict[str, Any], context: Any, before: StoredRecord, log: Any
) -> None:
    """Put back what ``stored_record`` saw (nothing: no record at all)."""
    key = record_key(identity)
    if before.sealed is None:
        store.delete(key)
    else:
        store.write_bytes(key, before.sealed, content_type="application/json")
    state = context.get("task_state_store")
    try:
        if state is not None and before.state_entry is not None:
            state.set(XCOM_JOB, before.state_entry)
        elif state is not None:
            state.delete(XCOM_JOB)
    except Exception as exc:  # noqa: BLE001 - the store record is what counts
        log.warning("could not reset the task state store: %s", exc)
    log.info("kinetic: the submit was rejected; the task's record is as it was")
