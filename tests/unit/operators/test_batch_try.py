"""A map task's try (``operators/batch_try.py``), step by step: plan, resume or start,
record, wait, cancel, defer, finish.  Real local jobs on a local connection; the task
instance is a stand-in (``tests/fixtures/batch_tries.py``)."""

from __future__ import annotations

import time

import pytest
from airflow.providers.common.compat.sdk import TaskDeferred

from airflow_provider_kinetic import KineticBatchFailed, KineticJobCancelled
from airflow_provider_kinetic.core.batch.resume import load_live, plan_key
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    cancel_requested,
    read_record,
)
from airflow_provider_kinetic.core.keys import databroadcast
from airflow_provider_kinetic.links import KineticBatchLink
from airflow_provider_kinetic.operators import batch_finish, batch_wait
from airflow_provider_kinetic.operators.batch_try import BatchTry
from airflow_provider_kinetic.operators.common import XCOM_BATCH, XCOM_OUTPUT_DIRS
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from tests.fixtures.batch_tries import (
    map_operator,
    open_try,
)

pytestmark = pytest.mark.usefixtures("local_conn")


def double(x: int) -> int:
    return 2 * x


def broken(x: int) -> int:
    if x == 1:
        raise ValueError("bad input 1")
    return x


def held(release: str, x: int) -> int:
    import os
    import time

    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    return x


def started(batch: BatchTry) -> BatchTry:
    """``batch`` planned and started as ``execute`` does (no earlier try)."""
    batch.resume_or_start(batch.plan())
    return batch


def test_plan_packs_the_batch_with_its_broadcast_window_and_starts_nothing():
    op = map_operator(python_callable=double, inputs=[1, 2, 3], broadcast=True)
    batch = open_try(op)
    planned = batch.plan()
    state = planned.state
    assert batch.state is state and batch.image_plan is not None
    assert (state.total, state.queue, state.group_name) == (3, [0, 1, 2], "m")
    assert state.tags == ["d", "m"] and state.work
    assert databroadcast.window_env(op.broadcast).items() <= state.template.env.items()
    assert not batch.store.exists(plan_key(state.group_id))  # nothing saved before start


def test_a_first_try_starts_its_plan_and_a_retry_of_the_same_work_resumes_it():
    op = map_operator(python_callable=double, inputs=[1, 2])
    first = started(open_try(op))
    assert first.record is None and first.store.exists(plan_key(first.batch.group_id))
    first.write_record()
    record = read_record(first.store, first.identity, first.secret)
    assert (record.kind, record.mode, record.group_id) == ("batch", SYNC, first.batch.group_id)
    assert not record.delivered and record.work == first.batch.work

    again = open_try(op, try_number=2)
    state = again.resume_or_start(again.plan())
    assert state.group_id == first.batch.group_id and again.batch is state
    assert again.record is not None and again.record.try_number == 1


def test_a_retry_of_other_work_or_after_delivery_starts_a_new_batch():
    first = started(open_try(map_operator(python_callable=double, inputs=[1, 2])))
    first.write_record()
    changed = open_try(map_operator(python_callable=double, inputs=[1, 2, 3]), try_number=2)
    assert changed.resume_or_start(changed.plan()).group_id != first.batch.group_id

    delivered = started(open_try(map_operator(python_callable=double, inputs=[5])))
    delivered.write_record(delivered=True, returned=True)
    retry = open_try(map_operator(python_callable=double, inputs=[5]), try_number=2)
    assert retry.resume_or_start(retry.plan()).group_id != delivered.batch.group_id
    assert retry.record is not None and retry.record.delivered


def test_wait_sync_then_finish_delivers_the_values_in_order():
    batch = started(open_try(map_operator(python_callable=double, inputs=[1, 2, 3])))
    url = batch.publish()
    xcom = batch.context["ti"].xcom
    assert xcom[KineticBatchLink.key] == url and len(xcom[XCOM_OUTPUT_DIRS]) == 3
    batch_wait.wait_sync(batch)
    assert batch.batch.finished and batch.waiting
    assert batch_finish.finish(batch) == [2, 4, 6]
    assert not batch.waiting  # nothing left to cancel
    assert xcom["return_value"] == [2, 4, 6]
    assert xcom[XCOM_BATCH]["counts"]["succeeded"] == 3
    assert read_record(batch.store, batch.identity, batch.secret).delivered


def test_a_failed_input_fails_the_try_with_every_position():
    op = map_operator(python_callable=broken, inputs=[0, 1, 2])
    batch = started(open_try(op))
    batch.publish()
    batch_wait.wait_sync(batch)
    with pytest.raises(KineticBatchFailed, match="1 of 3 inputs failed") as info:
        batch_finish.finish(batch)
    assert list(info.value.failures) == [1] and info.value.partial_results[2] == 2
    assert "return_value" not in batch.context["ti"].xcom
    assert not read_record(batch.store, batch.identity, batch.secret).delivered


def test_submit_only_hands_the_batch_over_and_cancel_leaves_it_running(tmp_path):
    release = tmp_path / "release"
    op = map_operator(python_callable=held, inputs=[[str(release), 1]], wait_for_completion=False)
    batch = started(open_try(op))
    handle = batch.submit_only()
    assert handle["group_id"] == batch.batch.group_id and handle["total"] == 1
    live = load_live(batch.store, handle["group_id"], batch.secret)
    assert list(live.active) == [0]
    assert read_record(batch.store, batch.identity, batch.secret).delivered
    batch_wait.cancel(batch)  # the sensor drives it now: nothing is cancelled
    assert not cancel_requested(batch.store, live.active[0])


def test_cancel_stops_the_running_children_only_while_waiting(tmp_path):
    release = tmp_path / "release"
    op = map_operator(python_callable=held, inputs=[[str(release), 1], [str(release), 2]])
    batch = started(open_try(op))
    assert not batch_wait.step(batch)  # launched, running
    handles = list(batch.batch.active.values())
    assert len(handles) == 2
    batch_wait.cancel(batch)  # not waiting yet
    assert not any(cancel_requested(batch.store, h) for h in handles)
    batch.waiting = True
    batch_wait.cancel(batch)
    assert all(cancel_requested(batch.store, h) for h in handles)


def test_the_deadline_cancels_the_children_and_fails(tmp_path):
    release = tmp_path / "release"
    batch = started(open_try(map_operator(python_callable=held, inputs=[[str(release), 1]])))
    batch.publish()
    batch.batch.deadline = time.time() - 1  # the execution_timeout has passed
    with pytest.raises(KineticJobCancelled, match="execution_timeout"):
        batch_wait.wait_sync(batch)
    (handle,) = batch.batch.active.values()
    assert cancel_requested(batch.store, handle)


def test_wait_deferred_hands_the_batch_to_the_trigger(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")
    release = tmp_path / "release"
    op = map_operator(python_callable=held, inputs=[[str(release), 1]], deferrable=True)
    batch = started(open_try(op))
    batch.publish()
    with pytest.raises(TaskDeferred) as info:
        batch_wait.wait_deferred(batch)
    trigger = info.value.trigger
    assert isinstance(trigger, KineticBatchTrigger) and info.value.method_name == "execute_complete"
    assert trigger.state["group_id"] == batch.batch.group_id and trigger.drive
    assert batch.batch.driver and trigger.state["driver"] == batch.batch.driver
    record = read_record(batch.store, batch.identity, batch.secret)
    assert record.mode == DEFERRED

    # Back from the trigger at the timeout: the reopened try cancels and fails.
    back = BatchTry.reopen(op, batch.context, batch.batch)
    assert back.waiting and back.identity == batch.identity
    with pytest.raises(KineticJobCancelled):
        batch_wait.resumed(back, {"status": "timeout", "message": "deadline"})
    (handle,) = back.batch.active.values()
    assert cancel_requested(back.store, handle)
    # Back in the worker, the worker watches the batch: the record says so.
    assert read_record(back.store, back.identity, back.secret).mode == SYNC


def test_a_delivered_batch_holds_its_artifacts_until_the_try_returned(monkeypatch):
    """cleanup='always' deletes every child's artifacts, the failed one's too; until
    the record says "returned" they are all held, so a try ended before that leaves
    the next try the same values (tests/integration/operators/test_map_try_record_truth.py)."""
    op = map_operator(python_callable=broken, inputs=[0, 1], return_exceptions=True)
    op.cleanup = "always"
    batch = started(open_try(op))
    batch.publish()
    batch_wait.wait_sync(batch)
    store, jobs = batch.store, list(batch.batch.jobs.values())
    seen = {}

    def emit(t, result, capacity):  # noqa: ANN001, ANN202 - the step before "returned"
        record = read_record(store, batch.identity, batch.secret)
        seen["record"] = (record.delivered, record.returned)
        seen["held"] = [store.exists(f"{job_id}/result.pkl") for job_id in jobs]
        seen["history"] = history.read(store, batch.batch.group_id)["artifacts"]["state"]

    monkeypatch.setattr(batch_finish, "emit", emit)
    result = batch_finish.finish(batch)
    assert result[0] == 0 and result[1]["__kinetic_error__"]
    assert seen["record"] == (True, False) and seen["held"] == [True, True]
    assert seen["history"].startswith("held")
    record = read_record(store, batch.identity, batch.secret)
    assert record.delivered and record.returned
    assert all(store.list(f"{job_id}/") == [] for job_id in jobs)  # released
    assert history.read(store, batch.batch.group_id)["artifacts"]["state"] == "deleted"


def test_a_dry_try_plans_without_a_context():
    op = map_operator(python_callable=double, inputs=[1])
    batch = BatchTry.dry(op)
    assert batch.context is None and batch.identity["run_id"] == "dry_run"
    state = batch.plan().state
    assert state.total == 1 and not batch.store.exists(plan_key(state.group_id))


def test_an_event_of_another_batch_fails_the_try_and_delivers_nothing(tmp_path, monkeypatch):
    """A cleared try's batch trigger that outlived the clear under this try's trigger id
    (``operators.job_wait.resumed``): its event carries that batch's state.  The try
    fails naming both batches; it never collects the other batch's values."""
    from airflow.providers.common.compat.sdk import AirflowException

    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")
    release = tmp_path / "release"
    other = started(open_try(map_operator(python_callable=double, inputs=[5])))
    batch_wait.wait_sync(other)  # the earlier try's batch, ended
    op = map_operator(python_callable=held, inputs=[[str(release), 1]], deferrable=True)
    batch = started(open_try(op))
    batch.publish()
    with pytest.raises(TaskDeferred):
        batch_wait.wait_deferred(batch)  # this try's record: DEFERRED on its own batch

    back = BatchTry.reopen(op, batch.context, other.batch)
    with pytest.raises(AirflowException, match=f"batch {other.batch.group_id}'s, not this try's"):
        batch_wait.resumed(back, {"status": "finished"})
    record = read_record(back.store, back.identity, back.secret)
    assert record.group_id == batch.batch.group_id and record.mode == DEFERRED
    assert not record.delivered
    batch_wait.cancel(BatchTry.reopen(op, batch.context, batch.batch))
