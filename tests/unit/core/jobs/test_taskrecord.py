"""The one rule for every try (core.jobs.taskrecord), row by row, on a real LocalStore.

The backend is the local backend with its status answered from a table: the rule
must decide from the status, the cancel marker, the record's mode and the result.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.jobs.signing import job_key, key_id, seal, sign
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    Step,
    TaskRecord,
    UnverifiedRecord,
    cancel_requested,
    decide_job,
    read_record,
    record_key,
    request_cancel,
    write_record,
)
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures import records

SECRET = b"s" * 32
IDENTITY = {"dag_id": "d", "run_id": "manual__2026-11-20T00:00:00+00:00", "task_id": "t"}


class TableBackend(LocalBackend):
    def __init__(self, root: str, status: JobStatus, reason: str | None = None):
        super().__init__(root)
        self.report = StatusReport(status, reason)
        self.cancelled: list[str] = []

    def status(self, handle):
        return self.report

    def cancel(self, handle) -> None:
        self.cancelled.append(handle.job_id)


def put_result(store: LocalStore, job_id: str, ok: bool) -> None:
    blob, _ = dump_result(
        make_result(success=ok, result=42, exception=None if ok else ValueError())
    )
    store.write_bytes(f"{job_id}/result.pkl.sig", sign(job_key(SECRET, job_id), blob).encode())
    store.write_bytes(f"{job_id}/result.pkl", blob)


def key_of(handle):
    return job_key(SECRET, handle.job_id)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(str(tmp_path))


def record(mode: str = SYNC, delivered: bool = False, returned: bool = False) -> TaskRecord:
    handle = records.handle("job-00000001", "/r").to_dict()
    return TaskRecord(kind="job", mode=mode, handle=handle, delivered=delivered, returned=returned)


DELIVERED = record(delivered=True, returned=True)  # its try returned it: a clear
UNRETURNED = record(delivered=True)  # its try ended between the XCom push and its return


@pytest.mark.parametrize(
    ("rec", "status", "result", "step", "why"),
    [
        (None, JobStatus.RUNNING, None, Step.SUBMIT, "no earlier job"),
        (DELIVERED, JobStatus.SUCCEEDED, True, Step.SUBMIT, "already delivered"),
        (DELIVERED, JobStatus.NOT_FOUND, True, Step.SUBMIT, "already delivered"),
        (UNRETURNED, JobStatus.NOT_FOUND, True, Step.COLLECT, "collecting the same result again"),
        (UNRETURNED, JobStatus.SUCCEEDED, True, Step.COLLECT, "collecting the same result again"),
        (UNRETURNED, JobStatus.NOT_FOUND, None, Step.SUBMIT, "ended NOT_FOUND"),
        (record(), JobStatus.RUNNING, None, Step.ADOPT, "still RUNNING"),
        (record(), JobStatus.PENDING, None, Step.ADOPT, "still PENDING"),
        (record(), JobStatus.SUCCEEDED, True, Step.COLLECT, "collecting"),
        (record(), JobStatus.NOT_FOUND, True, Step.COLLECT, "collecting"),
        (record(), JobStatus.NOT_FOUND, False, Step.SUBMIT, "ended NOT_FOUND"),
        (record(), JobStatus.NOT_FOUND, None, Step.SUBMIT, "ended NOT_FOUND"),
        (record(), JobStatus.FAILED, False, Step.SUBMIT, "ended FAILED"),
        (record(DEFERRED), JobStatus.RUNNING, None, Step.SUBMIT, "cleared or marked failed"),
        (record(DEFERRED), JobStatus.SUCCEEDED, True, Step.COLLECT, "collecting"),
    ],
)
def test_the_table(store, rec, status, result, step, why):
    backend = TableBackend(store.bucket, status)
    if result is not None:
        put_result(store, "job-00000001", result)
    got, job, _, reason = decide_job(rec, backend, store, key_of)
    assert got is step and why in reason
    if rec is not None:
        assert job.job_id == "job-00000001"
    # A live job of a deferred try is cancelled (marker first) before running again.
    cancelled = rec is not None and rec.mode == DEFERRED and status is JobStatus.RUNNING
    assert backend.cancelled == (["job-00000001"] if cancelled else [])
    assert cancel_requested(store, records.handle("job-00000001")) is cancelled


def test_a_job_being_cancelled_is_never_adopted(store):
    backend = TableBackend(store.bucket, JobStatus.RUNNING)
    request_cancel(store, backend, records.handle("job-00000001"))
    step, _, _, why = decide_job(record(), backend, store, key_of)
    assert step is Step.SUBMIT and "being cancelled" in why


def test_a_forged_result_is_not_collected(store):
    """NOT_FOUND with a result whose signature does not match: run again."""
    blob, _ = dump_result(make_result(success=True, result="forged"))
    store.write_bytes(
        "job-00000001/result.pkl.sig", sign(job_key(b"x" * 32, "job-00000001"), blob).encode()
    )
    store.write_bytes("job-00000001/result.pkl", blob)
    backend = TableBackend(store.bucket, JobStatus.NOT_FOUND)
    assert decide_job(record(), backend, store, key_of)[0] is Step.SUBMIT


def test_records_round_trip_and_forgeries_fail_the_try(store):
    """A record that fails its seal is never ignored (that ran its job a second time):
    the try fails, saying why and which key sealed it."""
    rec = record(DEFERRED)
    write_record(store, IDENTITY, rec, SECRET)
    assert read_record(store, IDENTITY, SECRET) == rec
    assert read_record(store, {**IDENTITY, "map_index": 3}, SECRET) is None
    assert record_key(IDENTITY).startswith("_airflow/tasks/d/manual__2026-11-20T00_00_00_00_00~")
    # Anyone who can write the bucket could swap the handle: the seal catches it.
    forged = {**rec.__dict__, "handle": records.handle("job-evil0001").to_dict()}
    other = b"wrong secret" * 3
    store.write_bytes(record_key(IDENTITY), seal(other, forged))
    with pytest.raises(UnverifiedRecord, match=f"sealed with signing key {key_id(other)}"):
        read_record(store, IDENTITY, SECRET)
    outer = json.loads(seal(SECRET, rec.__dict__))
    outer["record"]["handle"] = forged["handle"]  # our seal, another job
    store.write_bytes(record_key(IDENTITY), json.dumps(outer).encode())
    with pytest.raises(UnverifiedRecord, match="does not match its seal") as info:
        read_record(store, IDENTITY, SECRET)
    assert "does not run the function again" in str(info.value)
    store.write_bytes(record_key(IDENTITY), b"not json")
    with pytest.raises(UnverifiedRecord, match="not a sealed kinetic record"):
        read_record(store, IDENTITY, SECRET)


# ---- adopt only the same work; records at the earlier key layout ---------------------


@pytest.mark.parametrize(
    ("status", "same", "step", "cancelled"),
    [
        (JobStatus.RUNNING, True, Step.ADOPT, False),
        (JobStatus.RUNNING, False, Step.SUBMIT, True),
        (JobStatus.SUCCEEDED, True, Step.COLLECT, False),
        (JobStatus.SUCCEEDED, False, Step.SUBMIT, False),
    ],
)
def test_only_the_same_work_is_adopted_or_collected(store, status, same, step, cancelled):
    backend = TableBackend(store.bucket, status)
    rec = record(SYNC)
    rec.work = "w-old"
    got, old, _, why = decide_job(rec, backend, store, key_of, "w-old" if same else "w-new")
    assert got is step and old.job_id == "job-00000001"
    assert backend.cancelled == (["job-00000001"] if cancelled else [])
    assert cancel_requested(store, old) is cancelled
    if not same:
        assert "ran other work than this try's" in why


def test_records_without_a_work_digest_compare_nothing(store):
    """A record an earlier version wrote (no digest) follows the table alone."""
    backend = TableBackend(store.bucket, JobStatus.RUNNING)
    assert decide_job(record(SYNC), backend, store, key_of, "w-new")[0] is Step.ADOPT
    rec = record(SYNC)
    rec.work = "w-old"
    assert decide_job(rec, backend, store, key_of, None)[0] is Step.ADOPT


def test_a_written_record_reads_back_with_its_tasks_exact_ids(store):
    mine = record(DEFERRED)
    write_record(store, IDENTITY, mine, SECRET)
    assert read_record(store, IDENTITY, SECRET) == mine
    assert mine.identity == {**IDENTITY, "map_index": -1}


def test_a_superseded_record_is_kept_for_history(store):
    from airflow_provider_kinetic.core.jobs.signing import unseal
    from airflow_provider_kinetic.core.jobs.taskrecord import supersede_record

    rec = record(SYNC)
    key = supersede_record(store, IDENTITY, rec, SECRET)
    assert key.endswith("/superseded/job-00000001.json") and key.startswith("_airflow/tasks/d/")
    kept = unseal(SECRET, store.read_bytes(key), key)
    assert (
        kept["handle"]["job_id"] == "job-00000001"
        and kept["identity"]["run_id"] == IDENTITY["run_id"]
    )
