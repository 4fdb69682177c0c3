"""operators.task_try: one KineticRunOperator try's steps, run directly against a
backend whose jobs have already ended (no job runs here)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_kinetic import KineticJobSensor, KineticRunOperator
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import SYNC, record_key
from airflow_provider_kinetic.core.spec.failure import FailureClass
from airflow_provider_kinetic.core.spec.handles import (
    REASON_EVICTED,
    REASON_PREEMPTED,
    JobHandle,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.exceptions import KineticJobFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.operators import job_wait, takeover, task_record, task_try
from airflow_provider_kinetic.operators.task_try import TaskTry
from tests.fixtures import records
from tests.fixtures.ended_jobs import EndedBackend, put_result
from tests.fixtures.fake_ti import FakeTI, StateStore


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> EndedBackend:
    """The ``kinetic_local`` connection's backend (for the operator and the sensor)."""
    root = tmp_path / "kinetic"
    conn = {"conn_type": "kinetic", "extra": {"backend": "local", "root": str(root)}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_LOCAL", json.dumps(conn))
    ended = EndedBackend(str(root))
    monkeypatch.setattr(KineticHook, "get_backend", lambda self, kind=None: ended)
    return ended


@pytest.fixture
def context() -> dict[str, Any]:
    return {"ti": FakeTI(), "task_state_store": StateStore()}


def operator(**kw: Any) -> KineticRunOperator:
    return KineticRunOperator(
        task_id="t", python_callable=len, kinetic_conn_id="kinetic_local", **kw
    )


def backend_store(backend: EndedBackend) -> LocalStore:
    return LocalStore(backend.root)


def job(backend: EndedBackend, n: int) -> JobHandle:
    return records.handle(f"job-{n:08d}", backend.root)


def test_the_record_is_read_once_and_kept_current(backend, context, monkeypatch):
    reads = []
    real = task_record.read_record

    def counted(*args: Any) -> Any:
        reads.append(args)
        return real(*args)

    monkeypatch.setattr(task_record, "read_record", counted)
    first, second = job(backend, 1), job(backend, 2)
    put_result(backend_store(backend), second, value=7)
    backend.ended(second, JobStatus.SUCCEEDED)
    run = TaskTry.open(operator(), context)

    run.write_record(first, preemptions=1)
    run.write_record(second)
    assert run.finish(second, StatusReport(JobStatus.SUCCEEDED), 0) == 7

    assert len(reads) == 1  # at open, never again
    stored = real(run.store, run.identity, run.secret)
    assert stored == run.record
    assert stored.delivered and stored.preemptions == 1
    assert stored.attempts == [first.job_id, second.job_id]
    assert context["ti"].xcom["return_value"] == 7
    assert run.handle is None  # finished: on_kill leaves it alone


def test_open_falls_back_to_the_task_state_store(backend, context):
    handle = job(backend, 3)
    context["task_state_store"].set("kinetic_job", handle.to_dict())

    run = TaskTry.open(operator(), context)

    assert run.record is not None and run.record.mode == SYNC
    assert run.record.job == handle


def test_a_rejected_submit_puts_the_record_back(backend, context, monkeypatch):
    run = TaskTry.open(operator(), context)
    earlier = job(backend, 4)
    run.write_record(earlier)
    sealed, held = run.store.read_bytes(record_key(run.identity)), run.record

    def rejected(planned, backend_, store):
        raise OSError("upload refused")

    monkeypatch.setattr(task_try, "submit_planned", rejected)
    new = job(backend, 5)
    planned = SimpleNamespace(image=None, spec=SimpleNamespace(job_id=new.job_id), handle=new)
    with pytest.raises(OSError, match="upload refused"):
        run.submit(planned)

    assert run.store.read_bytes(record_key(run.identity)) == sealed
    assert run.record is held
    assert context["task_state_store"]["kinetic_job"]["job_id"] == earlier.job_id


def test_preemptions_are_counted_from_the_record(backend, context):
    op = operator(preemption_retries=1)
    run = TaskTry.open(op, context)
    handle = job(backend, 6)
    reclaimed = StatusReport(JobStatus.FAILED, REASON_PREEMPTED, "the spot VM was reclaimed")
    run.write_record(handle)

    def then(report: StatusReport) -> takeover.Takeover | None:
        return takeover.takeover(op, run.config, run.store, run.record, handle, report, run.log)

    first = then(reclaimed)
    assert first is not None and (first.step, first.preemptions) == (None, 1)
    assert first.resubmits == {"preemption": 1}
    assert first.failure is not None and first.failure.failure_class is FailureClass.PREEMPTION
    assert then(StatusReport(JobStatus.FAILED, "exit code 1")) is None
    # An eviction is infra, not a preemption: no infra re-submits by default.
    assert then(StatusReport(JobStatus.FAILED, REASON_EVICTED)) is None

    run.write_record(handle, preemptions=1)  # the budget is used up

    assert then(reclaimed) is None
    assert job_wait.next_job(run, handle, reclaimed) is None  # finish this one


def test_retry_on_counts_each_class_apart(backend, context):
    op = operator(retry_on={"infra": 1, "preemption": 0})
    run = TaskTry.open(op, context)
    handle = job(backend, 9)
    evicted = StatusReport(JobStatus.FAILED, REASON_EVICTED, "The node was low on memory.")
    run.write_record(handle)

    def then(report: StatusReport) -> takeover.Takeover | None:
        return takeover.takeover(op, run.config, run.store, run.record, handle, report, run.log)

    first = then(evicted)
    assert first is not None and first.resubmits == {"infra": 1} and first.preemptions == 0
    assert then(StatusReport(JobStatus.FAILED, REASON_PREEMPTED)) is None  # none for those
    run.write_record(handle, resubmits=first.resubmits)
    assert then(evicted) is None  # the infra budget is used up


def test_a_jobsets_preemptions_and_infra_failures_are_spent_in_place(backend, context):
    """A multi-slice job's JobSet restarted the gang for them (its maxRestarts): the task
    does not submit it again; a failure it never restarts for still counts as before."""
    op = operator(retry_on={"infra": 1, "preemption": 2, "user_error": 1})
    run = TaskTry.open(op, context)
    gang = replace(job(backend, 10), backend="jobset")
    run.write_record(gang)

    def then(report: StatusReport) -> takeover.Takeover | None:
        return takeover.takeover(op, run.config, run.store, run.record, gang, report, run.log)

    assert then(StatusReport(JobStatus.FAILED, REASON_PREEMPTED)) is None
    assert then(StatusReport(JobStatus.FAILED, REASON_EVICTED)) is None
    # The same failures of a one-slice job are re-submitted (the check above is the kind's).
    single = takeover.takeover(
        op, run.config, run.store, run.record, job(backend, 10),
        StatusReport(JobStatus.FAILED, REASON_PREEMPTED), run.log,
    )  # fmt: skip
    assert single is not None and single.resubmits == {"preemption": 1}


@pytest.mark.parametrize("succeeds", [True, False])
def test_the_sensor_and_the_operator_finish_a_job_alike(backend, context, succeeds):
    store = backend_store(backend)
    by_operator, by_sensor = job(backend, 7), job(backend, 8)
    status = JobStatus.SUCCEEDED if succeeds else JobStatus.FAILED
    for handle in (by_operator, by_sensor):
        put_result(store, handle, value=5, error=None if succeeds else ValueError("bad"))
        backend.ended(handle, status, None if succeeds else "exit code 1")
    run = TaskTry.open(operator(), context)
    sensor = KineticJobSensor(
        task_id="s", handle=by_sensor.to_dict(), kinetic_conn_id="kinetic_local", return_result=True
    )

    outcomes = []
    for finish in (
        lambda: run.finish(by_operator, backend.status(by_operator), 0),
        lambda: sensor.poke(context).xcom_value,
    ):
        try:
            outcomes.append(finish())
        except KineticJobFailed as exc:
            outcomes.append(str(exc).replace(by_sensor.job_id, by_operator.job_id))

    assert outcomes[0] == outcomes[1]
    failed = f"kinetic job {by_operator.job_id} failed: ValueError: bad"
    assert outcomes[0] == (5 if succeeds else failed)
    entries = [history.read(store, h.job_id) for h in (by_operator, by_sensor)]
    assert [(e["state"], e["reason"]) for e in entries] == 2 * [
        (entries[0]["state"], entries[0]["reason"])
    ]
    assert entries[0]["state"] == status.value
    assert entries[0]["artifacts"] == entries[1]["artifacts"]
    kept = entries[0]["artifacts"]["state"].startswith("kept: the job failed")
    assert kept is not succeeds
    for handle in (by_operator, by_sensor):
        done = [what for what, job_id in backend.events if job_id == handle.job_id]
        assert done[-2:] == ["release", "cancel"]
        assert history.read_log(store, handle.job_id) == backend.log_text
