"""KineticRunOperator outside a DAG run: on_kill, retry adoption, sync log streaming.

The operator runs against the real local backend; the task instance and the 3.3
task state store are small stand-ins (no scheduler here).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.fake_ti import FakeTI, StateStore
from tests.fixtures.waiting import DEADLINE_S, wait_for


def sleepy(seconds: float, value: int) -> int:
    import time

    print("started", flush=True)
    time.sleep(seconds)  # timing-ok: the job's simulated work: 0 s, or until the test kills it
    print("finished", flush=True)
    return value


def held(release: str, value: int) -> int:
    import os
    import time

    print("started", flush=True)
    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    print("finished", flush=True)
    return value


class WatchClock:
    """The operator's monotonic clock (``operators.job_wait``), moved
    only by its waits on the job: each ``LocalBackend.wait(seconds)`` waits on the job
    for real, then moves the clock on by ``seconds``.  It starts once the job has
    printed "started", whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def watch_clock(monkeypatch) -> WatchClock:
    from airflow_provider_kinetic.operators import job_wait

    clock, real_wait = WatchClock(), LocalBackend.wait

    def wait(backend: LocalBackend, handles: list[JobHandle], seconds: float) -> None:
        wait_for("the job to start", lambda: "started" in backend.read_logs(handles[0])[0])
        real_wait(backend, handles, seconds)
        clock.now += seconds

    monkeypatch.setattr(job_wait, "time", clock)
    monkeypatch.setattr(LocalBackend, "wait", wait)
    return clock


def test_on_kill_cancels_the_job_this_try_started(local_conn):
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[120, 1],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
    )
    ti, errors = FakeTI(), []

    def run() -> None:
        try:
            op.execute({"ti": ti})
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    wait_for("the job's handle in XCom", lambda: "kinetic_job" in ti.xcom)
    handle = JobHandle.from_dict(ti.xcom["kinetic_job"])
    backend = LocalBackend(str(local_conn))
    wait_for("the job to start", lambda: "started" in backend.read_logs(handle)[0])
    op.on_kill()
    worker.join(DEADLINE_S)
    assert not worker.is_alive()
    assert errors and "cancelled" in str(errors[0])
    # Collected: its local state went, and its history says it was cancelled.
    assert backend.status(handle).status.value == "NOT_FOUND"
    entry = history.read(LocalStore(str(local_conn)), handle.job_id)
    assert entry["state"] == "CANCELLED" and entry["ended_at"]
    assert "cancelled" in entry["reason"]


def test_retry_adopts_the_running_job_instead_of_submitting_again(
    local_conn, tmp_path, capfd, caplog
):
    config = KineticConfig(backend="local", root=str(local_conn))
    backend = LocalBackend(config.bucket_name)
    release = tmp_path / "release"
    previous, _ = submit_job(
        JobRequest(func=held, args=(str(release), 42)),
        config,
        backend,
        config.store(),
        deployment_secret(),
    )
    wait_for("the job to start", lambda: "started" in backend.read_logs(previous)[0])
    store = StateStore(kinetic_job=previous.to_dict())
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 0],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
    )
    ti, values = FakeTI(), []
    worker = threading.Thread(
        target=lambda: values.append(op.execute({"ti": ti, "task_state_store": store}))
    )
    worker.start()
    # Published once the try has adopted (or submitted) a job: the job runs until now.
    wait_for("the try to publish its job", lambda: "kinetic_job" in ti.xcom)
    release.touch()
    worker.join(DEADLINE_S)
    assert not worker.is_alive() and values == [42]
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
    assert op.execute({"ti": FakeTI(), "task_state_store": store}) == 7
    assert store["kinetic_job"]["func_name"] == "sleepy"


def test_trigger_error_redefers_then_cancels(local_conn):
    from airflow.providers.common.compat.sdk import TaskDeferred

    config = KineticConfig(backend="local", root=str(local_conn))
    backend = LocalBackend(config.bucket_name)
    handle, _ = submit_job(
        JobRequest(func=sleepy, args=(120, 1)), config, backend, config.store(), deployment_secret()
    )
    op = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 0],
        kinetic_conn_id="kinetic_local",
        poll_interval=0.1,
    )
    event = {"status": "error", "message": "API hiccup", "handle": handle, "attempt": 0}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete({"ti": FakeTI()}, event=event)
    assert deferred.value.trigger.attempt == 1
    assert backend.status(handle).status.value == "RUNNING"  # still running: not cancelled
    with pytest.raises(Exception, match="cancelled: trigger ended with error"):
        op.execute_complete({"ti": FakeTI()}, event={**event, "attempt": 3})
    report = backend.status(handle)
    assert report.status.value == "FAILED" and report.reason == "cancelled"


def test_deferrable_collects_a_quick_job_before_deferring(local_conn, watch_clock):
    """A job that ends within DEFER_GRACE_S never reaches the triggerer (no race between
    the worker's exit report and the trigger's event); a longer one defers, carrying
    the log offset already shown so no line repeats.  The watch is timed on the
    operator's own clock (``watch_clock``): exactly DEFER_GRACE_S of waits."""
    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_kinetic.operators.common import DEFER_GRACE_S

    quick = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[0, 5],
        kinetic_conn_id="kinetic_local",
        deferrable=True,
    )
    assert quick.execute({"ti": FakeTI()}) == 5

    slow = KineticRunOperator(
        task_id="t",
        python_callable=sleepy,
        op_args=[DEFER_GRACE_S + 120, 6],
        kinetic_conn_id="kinetic_local",
        deferrable=True,
    )
    ti = FakeTI()
    start = watch_clock.now
    with pytest.raises(TaskDeferred) as deferred:
        slow.execute({"ti": ti})
    # Deferred once the grace had passed on its clock: not at once, not later.
    assert watch_clock.now - start == pytest.approx(DEFER_GRACE_S)
    trigger = deferred.value.trigger
    backend = LocalBackend(KineticConfig(backend="local", root=str(local_conn)).bucket_name)
    handle = JobHandle.from_dict(ti.xcom["kinetic_job"])
    assert backend.status(handle).status.value == "RUNNING"  # deferred before its end
    text, offset = backend.read_logs(handle, 0)
    assert "started" in text and trigger.log_offset == offset > 0
    slow.on_kill()
    wait_for("the job to be cancelled", lambda: backend.status(handle).status.value == "FAILED")


def test_resumed_task_takes_the_final_state_from_the_event(local_conn):
    """The trigger's event carries the job's final state: the resumed task collects on
    it without reading the status again.  Here the local backend's own record of the
    job is gone after the event (a second read would say NOT_FOUND), and the task still
    delivers the job's value; an event without a final state does read it."""
    import shutil

    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR
    from airflow_provider_kinetic.core.backends.local.presence import live_supervisors

    config = KineticConfig(backend="local", root=str(local_conn))
    backend = LocalBackend(config.bucket_name)
    handle, _ = submit_job(
        JobRequest(func=sleepy, args=(0, 11)), config, backend, config.store(), deployment_secret()
    )
    wait_for("the job to succeed", lambda: backend.status(handle).status.value == "SUCCEEDED")
    # The supervisor writes the exit code, then exits: a record removed while it lives
    # reads as a store that cannot be seen, not as a job that is gone.
    state_dir = str(local_conn / STATE_DIR)
    wait_for("its supervisor to exit", lambda: handle.job_id not in live_supervisors(state_dir))
    event = {"status": "SUCCEEDED", "message": "", "reason": None, "handle": handle.to_dict()}
    shutil.rmtree(local_conn / STATE_DIR / handle.job_id)
    assert backend.status(handle).status.value == "NOT_FOUND"
    op = KineticRunOperator(
        task_id="t", python_callable=sleepy, op_args=[0, 0], kinetic_conn_id="kinetic_local"
    )
    ti = FakeTI()
    assert op.execute_complete({"ti": ti}, event=event) == 11

    # An error event is no final answer: the job itself is asked (still running: wait).
    running, _ = submit_job(
        JobRequest(func=sleepy, args=(120, 1)), config, backend, config.store(), deployment_secret()
    )
    error = {"status": "error", "message": "x", "handle": running.to_dict(), "attempt": 0}
    with pytest.raises(TaskDeferred):
        op.execute_complete({"ti": FakeTI()}, event=error)
    backend.cancel(running)


def test_an_event_of_another_tries_job_is_set_aside_for_the_tries_own(local_conn):
    """A cleared try's trigger can outlive the clear under the next try's trigger id
    (SQLite gives a deleted row's id to the next trigger; seen under ``airflow
    standalone`` on 3.1): its event, about the old job, resumes the new try.  The try
    acts on the job its record names: it finishes its own job when that has ended, and
    defers on it when it still runs; the old job's end never fails it."""
    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_kinetic.core.jobs.taskrecord import DEFERRED, TaskRecord, write_record
    from airflow_provider_kinetic.operators.common import task_identity

    config = KineticConfig(backend="local", root=str(local_conn))
    backend, store = LocalBackend(config.bucket_name), config.store()

    def submit(seconds: float, value: int) -> JobHandle:
        handle, _ = submit_job(
            JobRequest(func=sleepy, args=(seconds, value)), config, backend, store,
            deployment_secret(),
        )  # fmt: skip
        return handle

    old, own = submit(120, 1), submit(0, 11)
    backend.cancel(old)  # the new try cancelled the cleared try's job: its trigger saw it
    wait_for("its own job to succeed", lambda: backend.status(own).status.value == "SUCCEEDED")
    ti = FakeTI(try_number=2)
    record = TaskRecord(kind="job", mode=DEFERRED, try_number=2, handle=own.to_dict(),
                        attempts=[own.job_id])  # fmt: skip
    write_record(store, task_identity({"ti": ti}), record, deployment_secret())
    stale = {"status": "FAILED", "reason": "cancelled", "message": "", "handle": old.to_dict()}
    op = KineticRunOperator(
        task_id="t", python_callable=sleepy, op_args=[0, 0], kinetic_conn_id="kinetic_local"
    )
    assert op.execute_complete({"ti": ti}, event=stale) == 11

    # Its own job still running: the try defers on it, not on the old one.
    running = submit(120, 2)
    record = TaskRecord(kind="job", mode=DEFERRED, try_number=2, handle=running.to_dict(),
                        attempts=[running.job_id])  # fmt: skip
    write_record(store, task_identity({"ti": ti}), record, deployment_secret())
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete({"ti": FakeTI(try_number=2)}, event=stale)
    assert deferred.value.trigger.handle["job_id"] == running.job_id
    assert backend.status(running).status.value == "RUNNING"
    backend.cancel(running)
