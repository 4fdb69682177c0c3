"""KineticRunOperator outside a DAG run: on_kill, retry adoption, sync log streaming.

The operator runs against the real local backend; the task instance and the 3.3
task state store are small stand-ins (no scheduler here).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.backends.local import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore


class TI:
    dag_id, task_id, run_id, map_index, try_number = "d", "t", "manual__1", -1, 1

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}
        self.start_date = datetime.now(UTC)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


class StateStore(dict):
    def set(self, key: str, value: Any) -> None:
        self[key] = json.loads(json.dumps(value))


def sleepy(seconds: float, value: int) -> int:
    import time

    print("started", flush=True)
    time.sleep(seconds)
    print("finished", flush=True)
    return value


@pytest.fixture
def local_conn(monkeypatch, tmp_path) -> Path:
    root = tmp_path / "kinetic"
    conn = {"conn_type": "kinetic", "extra": {"backend": "local", "root": str(root)}}
    monkeypatch.setenv("AIRFLOW_CONN_KINETIC_LOCAL", json.dumps(conn))
    return root


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_on_kill_cancels_the_job_this_try_started(local_conn):
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[120, 1],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
    )
    ti, errors = TI(), []

    def run() -> None:
        try:
            op.execute({"ti": ti})
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    _wait(lambda: "kinetic_job" in ti.xcom)
    handle = JobHandle.from_dict(ti.xcom["kinetic_job"])
    backend = LocalBackend(str(local_conn))
    _wait(lambda: "started" in backend.read_logs(handle)[0])
    op.on_kill()
    worker.join(60)
    assert not worker.is_alive()
    assert errors and "cancelled" in str(errors[0])
    # Collected: its local state went, and its history says it was cancelled.
    assert backend.status(handle).status.value == "NOT_FOUND"
    entry = history.read(LocalStore(str(local_conn)), handle.job_id)
    assert entry["state"] == "CANCELLED" and entry["ended_at"]
    assert "cancelled" in entry["reason"]


def test_retry_adopts_the_running_job_instead_of_submitting_again(local_conn, capfd, caplog):
    config = KineticConfig(backend="local", root=str(local_conn))
    backend = LocalBackend(config.bucket_name)
    previous, _ = submit_job(JobRequest(func=sleepy, args=(1.5, 42)), config, backend)
    store = StateStore(kinetic_job=previous.to_dict())
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 0],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
    )
    ti = TI()
    assert op.execute({"ti": ti, "task_state_store": store}) == 42
    assert ti.xcom["kinetic_job"]["job_id"] == previous.job_id
    # No second job: the store's history knows only the adopted one.
    assert [p.parent.name for p in (local_conn / "history").glob("*/entry.json")] == [
        previous.job_id
    ]
    log = "".join(capfd.readouterr()) + caplog.text
    assert f"adopting still-RUNNING kinetic job {previous.job_id}" in log
    # Each line of the job's log reached the task log exactly once.
    assert log.count(f"[{previous.job_id}] started") == 1
    assert log.count(f"[{previous.job_id}] finished") == 1


def test_new_submission_is_remembered_for_the_next_try(local_conn):
    store = StateStore()
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 7],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
    )
    assert op.execute({"ti": TI(), "task_state_store": store}) == 7
    assert store["kinetic_job"]["func_name"] == "sleepy"


def test_trigger_error_redefers_then_cancels(local_conn):
    from airflow.providers.common.compat.sdk import TaskDeferred

    config = KineticConfig(backend="local", root=str(local_conn))
    backend = LocalBackend(config.bucket_name)
    handle, _ = submit_job(JobRequest(func=sleepy, args=(120, 1)), config, backend)
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 0],
        kinetic_conn_id="kinetic_local",
        poll_interval=0.1,
    )
    event = {"status": "error", "message": "API hiccup", "handle": handle, "attempt": 0}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete({"ti": TI()}, event=event)
    assert deferred.value.trigger.attempt == 1
    assert backend.status(handle).status.value == "RUNNING"  # still running: not cancelled
    with pytest.raises(Exception, match="cancelled: trigger ended with error"):
        op.execute_complete({"ti": TI()}, event={**event, "attempt": 3})
    report = backend.status(handle)
    assert report.status.value == "FAILED" and report.reason == "cancelled"


def test_deferrable_collects_a_quick_job_before_deferring(local_conn):
    """A job that ends within DEFER_GRACE_S never reaches the triggerer (no race between
    the worker's exit report and the trigger's event); a longer one defers, carrying
    the log offset already shown so no line repeats."""
    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_kinetic.operators.common import DEFER_GRACE_S

    quick = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 5],
        kinetic_conn_id="kinetic_local",
        deferrable=True,
    )
    assert quick.execute({"ti": TI()}) == 5

    slow = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[DEFER_GRACE_S + 30, 6],
        kinetic_conn_id="kinetic_local",
        deferrable=True,
    )
    ti = TI()
    start = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        slow.execute({"ti": ti})
    assert DEFER_GRACE_S <= time.monotonic() - start < DEFER_GRACE_S + 10
    trigger = deferred.value.trigger
    backend = LocalBackend(KineticConfig(backend="local", root=str(local_conn)).bucket_name)
    handle = JobHandle.from_dict(ti.xcom["kinetic_job"])
    text, offset = backend.read_logs(handle, 0)
    assert "started" in text and trigger.log_offset == offset > 0
    slow.on_kill()
    _wait(lambda: backend.status(handle).status.value == "FAILED")


def test_resumed_task_takes_the_final_state_from_the_event(local_conn):
    """The trigger's event carries the job's final state: the resumed task collects on
    it without reading the status again.  Here the local backend's own record of the
    job is gone after the event (a second read would say NOT_FOUND), and the task still
    delivers the job's value; an event without a final state does read it."""
    import shutil

    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_kinetic.core.backends.local import STATE_DIR
    from airflow_provider_kinetic.core.backends.local_presence import live_supervisors

    config = KineticConfig(backend="local", root=str(local_conn))
    backend = LocalBackend(config.bucket_name)
    handle, _ = submit_job(JobRequest(func=sleepy, args=(0, 11)), config, backend)
    _wait(lambda: backend.status(handle).status.value == "SUCCEEDED")
    # The supervisor writes the exit code, then exits: a record removed while it lives
    # reads as a store that cannot be seen, not as a job that is gone.
    state_dir = str(local_conn / STATE_DIR)
    _wait(lambda: handle.job_id not in live_supervisors(state_dir))
    event = {"status": "SUCCEEDED", "message": "", "reason": None, "handle": handle.to_dict()}
    shutil.rmtree(local_conn / STATE_DIR / handle.job_id)
    assert backend.status(handle).status.value == "NOT_FOUND"
    op = KineticRunOperator(
        task_id="t", python_callable=sleepy, op_args=[0, 0], kinetic_conn_id="kinetic_local"
    )
    ti = TI()
    assert op.execute_complete({"ti": ti}, event=event) == 11

    # An error event is no final answer: the job itself is asked (still running: wait).
    running, _ = submit_job(JobRequest(func=sleepy, args=(120, 1)), config, backend)
    error = {"status": "error", "message": "x", "handle": running.to_dict(), "attempt": 0}
    with pytest.raises(TaskDeferred):
        op.execute_complete({"ti": TI()}, event=error)
    backend.cancel(running)
