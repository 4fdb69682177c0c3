"""triggers.end_task: a trigger ends its task itself when its job succeeded and nothing
must run on a worker after it: the worker's finish (record, history, cleanup, usage),
no settle hold, and the worker's path whenever the value or the record says so."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.triggers.base import TaskSuccessEvent

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    TaskRecord,
    decide_job,
    read_record,
    write_record,
)
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.operators.end_task import DEFAULT_XCOM_BACKENDS, worker_needed
from airflow_provider_kinetic.triggers.end_task import MAX_XCOM_BYTES, EndTask, json_native
from airflow_provider_kinetic.triggers.job import KineticJobTrigger
from tests.fixtures import records
from tests.fixtures.ended_jobs import EndedBackend, put_result

IDENTITY = {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1, "try_number": 1}
JOB = "job-00000001"


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "root")


@pytest.fixture
def store(root: str):
    return KineticConfig(root=root).store()


@pytest.fixture
def backend(root: str) -> EndedBackend:
    return EndedBackend(root)


@pytest.fixture
def job(store):
    return records.handle(JOB, store.bucket)


@pytest.fixture(autouse=True)
def pushed(monkeypatch) -> list[tuple[str, str, Any]]:
    """The XComs the trigger hands Airflow, as (task_id, key, value) in order (the Task
    SDK's ``XCom.set`` needs a triggerer's channel: tests/integration/test_standalone.py
    has the real one)."""
    from airflow_provider_kinetic.triggers import end_task

    seen: list[tuple[str, str, Any]] = []

    def push(identity: dict, xcoms: dict) -> None:
        seen.extend((identity["task_id"], k, v) for k, v in xcoms.items())

    monkeypatch.setattr(end_task, "push_xcoms", push)
    return seen


def _record(store, job, **fields: Any) -> TaskRecord:
    values = {"kind": "job", "mode": DEFERRED, "try_number": 1, "handle": job.to_dict()}
    record = TaskRecord(**{**values, "attempts": [job.job_id], **fields})
    write_record(store, IDENTITY, record, deployment_secret())
    return record


def _trigger(root, job, backend, *, end=True, not_before=None, **end_fields) -> KineticJobTrigger:
    """A trigger as a triggerer re-creates it (``not_before`` set by another process:
    its normal event would be held)."""
    end_task = EndTask("on_success", dict(IDENTITY), **end_fields).to_dict() if end else None
    trigger = KineticJobTrigger(
        job.to_dict(),
        config_to_json(KineticConfig(root=root)),
        poll_interval=0.05,
        not_before=not_before if not_before is not None else 1_000.0,
        end_task=end_task,
    )
    trigger._backend = lambda: backend  # type: ignore[method-assign]
    return trigger


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _lines(trigger) -> list[str]:
    """What the trigger logs from here on."""
    handler = _Lines()
    logger = logging.getLogger(f"kinetic.test.trigger.{id(trigger)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    trigger._log = logger
    return handler.lines


def _events(trigger) -> list:
    async def run() -> list:
        return [event async for event in trigger.run()]

    return asyncio.run(run())


def test_a_succeeded_job_ends_its_task_in_the_trigger(
    root, store, backend, job, monkeypatch, pushed
):
    from airflow_provider_kinetic.triggers import settle

    holds: list[float] = []

    async def held(not_before: float) -> None:
        holds.append(not_before)

    monkeypatch.setattr("airflow_provider_kinetic.triggers.job.hold", held)
    _record(store, job)
    put_result(store, job, value={"answer": 42, "loss": [0.5, 0.25]})
    backend.ended(job, JobStatus.SUCCEEDED)
    trigger = _trigger(root, job, backend, not_before=settle.time.time() + 3600)

    [event] = _events(trigger)

    assert isinstance(event, TaskSuccessEvent) and not event.xcoms  # pushed before it
    assert [(task, key) for task, key, _ in pushed] == [
        ("t", "return_value"),
        ("t", "kinetic_usage"),
    ]
    assert pushed[0][2] == {"answer": 42, "loss": [0.5, 0.25]}
    assert pushed[1][2]["attempts"] == 1
    assert holds == []  # an event that ends the task is not held
    # The worker's finish: the record holds the value, history says how it ended, the
    # artifacts went by the policy, the Job was deleted.
    record = read_record(store, IDENTITY, deployment_secret())
    assert record.delivered and record.returned
    assert record.xcoms == {"return_value": {"answer": 42, "loss": [0.5, 0.25]}}
    entry = history.read(store, JOB)
    assert entry["state"] == "SUCCEEDED" and entry["artifacts"]["state"] == "deleted"
    assert not store.list(f"{JOB}/") and ("cancel", JOB) in backend.events
    # A clear of the task afterwards runs it again (the record was returned).
    step, *_ = decide_job(record, backend, store, result_key, None)
    assert step.value == "submit"


def test_a_trigger_recreated_after_a_lost_event_hands_the_same_value(
    root, store, backend, job, pushed
):
    _record(store, job)
    put_result(store, job, value=[1, 2, 3])
    backend.ended(job, JobStatus.SUCCEEDED)
    [first] = _events(_trigger(root, job, backend))
    assert isinstance(first, TaskSuccessEvent)
    backend.reports.clear()  # the job is gone now: NOT_FOUND
    backend.events.clear()
    pushed.clear()

    [again] = _events(_trigger(root, job, backend))

    assert isinstance(again, TaskSuccessEvent)
    # The value again; the usage was an account of the first trigger's (logged, sent).
    assert pushed == [("t", "return_value", [1, 2, 3])]
    assert backend.events == []  # nothing read or done to the job: no second finish
    assert history.read(store, JOB)["state"] == "SUCCEEDED"


@pytest.mark.parametrize(
    "value, why",
    [
        ((1, 2), "a tuple, not plain JSON"),
        ({"x": float("nan")}, "a dict, not plain JSON"),
        ("x" * (MAX_XCOM_BYTES + 1), "bytes of JSON (over"),
    ],
)
def test_a_value_that_is_not_plain_json_goes_through_a_worker(
    root, store, backend, job, value, why, pushed
):
    """Nothing of the job is changed: the resumed worker finishes it as before."""
    before = _record(store, job)
    put_result(store, job, value=value)
    backend.ended(job, JobStatus.SUCCEEDED)
    trigger = _trigger(root, job, backend, not_before=0.0)
    lines = _lines(trigger)

    [event] = _events(trigger)

    assert not isinstance(event, TaskSuccessEvent)
    assert event.payload["status"] == "SUCCEEDED"
    said = [line for line in lines if "a worker finishes the task" in line]
    assert len(said) == 1 and why in said[0], lines
    assert pushed == []
    assert read_record(store, IDENTITY, deployment_secret()) == before
    assert store.exists(f"{JOB}/result.pkl") and ("cancel", JOB) not in backend.events
    assert history.read(store, JOB) is None


@pytest.mark.parametrize(
    "case",
    ["operator said no", "record of another job", "record of another try", "job failed"],
)
def test_the_worker_finishes_whenever_the_trigger_may_not(root, store, backend, job, case, pushed):
    other = records.handle("job-00000002", store.bucket)
    _record(
        store,
        other if case == "record of another job" else job,
        try_number=2 if case == "record of another try" else 1,
    )
    if case == "job failed":
        put_result(store, job, error=ValueError("bad input"))
        backend.ended(job, JobStatus.FAILED)
    else:
        put_result(store, job, value=42)
        backend.ended(job, JobStatus.SUCCEEDED)
    trigger = _trigger(root, job, backend, end=case != "operator said no", not_before=0.0)

    [event] = _events(trigger)

    assert not isinstance(event, TaskSuccessEvent)
    assert event.payload["status"] in ("SUCCEEDED", "FAILED")
    assert store.exists(f"{JOB}/result.pkl") and ("cancel", JOB) not in backend.events
    assert history.read(store, JOB) is None and pushed == []


def test_an_xcom_push_that_fails_leaves_the_job_to_the_worker(
    root, store, backend, job, monkeypatch
):
    """Airflow refused the value: nothing of the job was changed and the record does not
    claim it, so the resumed worker finishes the task as before (never a lost value)."""
    from airflow_provider_kinetic.triggers import end_task

    def refuse(identity: dict, xcoms: dict) -> None:
        raise RuntimeError("the API server refused the XCom")

    monkeypatch.setattr(end_task, "push_xcoms", refuse)
    before = _record(store, job)
    put_result(store, job, value=42)
    backend.ended(job, JobStatus.SUCCEEDED)

    [event] = _events(_trigger(root, job, backend, not_before=0.0))

    assert not isinstance(event, TaskSuccessEvent) and event.payload["status"] == "SUCCEEDED"
    assert read_record(store, IDENTITY, deployment_secret()) == before
    assert store.exists(f"{JOB}/result.pkl") and history.read(store, JOB) is None


def test_a_sensor_that_takes_no_value_ends_in_its_trigger(root, store, backend, job, pushed):
    """``KineticJobSensor`` without ``return_result``: the job is finished (history, the
    policy, the Job) without reading its result, and the task ends with no XCom."""
    put_result(store, job, value=42)
    backend.ended(job, JobStatus.SUCCEEDED)
    trigger = _trigger(root, job, backend, not_before=0.0, push_value=False, collect=False)

    [event] = _events(trigger)

    assert isinstance(event, TaskSuccessEvent) and not event.xcoms and pushed == []
    assert history.read(store, JOB)["state"] == "SUCCEEDED"
    assert not store.list(f"{JOB}/") and ("cancel", JOB) in backend.events
    assert read_record(store, IDENTITY, deployment_secret()) is None  # none was needed


def test_dag_test_resumes_the_task_with_the_event(root, store, backend, job):
    """A trigger run in the deferring process (``dag.test()``) leaves the finish to the
    task: dag.test resumes it with the event's payload, whatever the event."""
    _record(store, job)
    put_result(store, job, value=42)
    backend.ended(job, JobStatus.SUCCEEDED)
    made = _trigger(root, job, backend, not_before=0.0)
    end_task = made.end_task
    trigger = KineticJobTrigger(
        job.to_dict(), config_to_json(KineticConfig(root=root)), end_task=end_task
    )  # made here, at "deferral": its deadline is this process's
    trigger._backend = lambda: backend  # type: ignore[method-assign]

    [event] = _events(trigger)

    assert not isinstance(event, TaskSuccessEvent) and event.payload["status"] == "SUCCEEDED"


def test_end_task_validates_itself():
    with pytest.raises(ValueError, match="cleanup='sometimes': one of on_success, always"):
        EndTask("sometimes", dict(IDENTITY))
    with pytest.raises(ValueError, match="lacks run_id"):
        EndTask("on_success", {"dag_id": "d", "task_id": "t"})
    end = EndTask("never", dict(IDENTITY), push_value=False)
    assert EndTask.from_dict(end.to_dict()) == end


def test_json_native():
    assert json_native({"a": [1, 2.5, "x", None, True, {"b": []}]})
    for value in [(1,), {1: "a"}, b"x", float("inf"), {"a": {1, 2}}]:
        assert not json_native(value), value


@pytest.fixture
def ends_tasks(monkeypatch) -> None:
    """``[kinetic] trigger_ends_tasks`` as it is by default."""
    monkeypatch.delenv("AIRFLOW__KINETIC__TRIGGER_ENDS_TASKS", raising=False)


def test_a_deployment_can_send_every_task_back_to_a_worker(monkeypatch):
    monkeypatch.setenv("AIRFLOW__KINETIC__TRIGGER_ENDS_TASKS", "False")
    assert worker_needed(_op()) == "[kinetic] trigger_ends_tasks = False"
    monkeypatch.setenv("AIRFLOW__KINETIC__TRIGGER_ENDS_TASKS", "True")
    assert worker_needed(_op()) is None


def _op(**fields: Any) -> SimpleNamespace:
    values = {"outlets": [], "output_key": None, "cache_settings": None, "multiple_outputs": False}
    return SimpleNamespace(**{**values, **fields})


@pytest.mark.parametrize(
    "fields, why",
    [
        ({"outlets": ["alias"]}, "its asset events (output_asset, outlets)"),
        ({"output_key": "models/churn"}, "output_key 'models/churn'"),
        ({"cache_settings": object()}, "cache=True"),
        ({"multiple_outputs": True}, "multiple_outputs"),
    ],
)
def test_what_needs_a_worker_after_the_job(fields, why, ends_tasks):
    assert worker_needed(_op()) is None
    assert worker_needed(_op(**fields)) == why


def test_a_deployment_xcom_backend_needs_a_worker(monkeypatch, ends_tasks):
    for default in DEFAULT_XCOM_BACKENDS:
        monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", default)
        assert worker_needed(_op()) is None
    backend = "airflow.providers.common.io.xcom.backend.XComObjectStorageBackend"
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", backend)
    assert worker_needed(_op()) == f"the XCom backend {backend}"


def test_openlineage_with_a_transport_needs_a_worker(monkeypatch, tmp_path, ends_tasks):
    monkeypatch.setenv(
        "AIRFLOW__OPENLINEAGE__TRANSPORT", '{"type": "file", "log_file_path": "/dev/null"}'
    )
    from airflow.providers.openlineage import conf as ol_conf

    for cached in ("transport", "config_path", "is_disabled"):
        getattr(getattr(ol_conf, cached, None), "cache_clear", lambda: None)()
    try:
        assert worker_needed(_op()) == "OpenLineage"
    finally:
        monkeypatch.delenv("AIRFLOW__OPENLINEAGE__TRANSPORT")
        for cached in ("transport", "config_path", "is_disabled"):
            getattr(getattr(ol_conf, cached, None), "cache_clear", lambda: None)()
