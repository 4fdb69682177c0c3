"""triggers.end_batch: a driven batch trigger ends its map task itself once every child
succeeded and nothing must run on a worker after it (issue 46), on a real local
backend: the worker's finish (ended state, XComs, record, history, cleanup, usage), no
settle hold, the same values again after a lost event, and the worker's path when a
child failed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from airflow.triggers.base import TaskSuccessEvent

from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.resume import delivered_state
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    TaskRecord,
    read_record,
    write_record,
)
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from airflow_provider_kinetic.triggers.end_task import EndTask

IDENTITY = {"dag_id": "d", "run_id": "manual__1", "task_id": "sweep", "map_index": -1,
            "try_number": 1}  # fmt: skip
INPUTS = 3


def triple(x: int) -> int:
    return 3 * x


def triple_but_one(x: int) -> int:
    if x == 1:
        raise ValueError("input 1 is bad")
    return 3 * x


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The XComs the trigger hands Airflow, as (key, value) in order (the Task SDK's
    ``XCom.set`` needs a triggerer's channel: tests/integration/test_standalone.py has
    the real one)."""
    from airflow_provider_kinetic.triggers import end_task

    seen: list[tuple[str, Any]] = []
    monkeypatch.setattr(end_task, "push_xcoms", lambda identity, xcoms: seen.extend(xcoms.items()))
    return seen


def _deferred(config: KineticConfig, func: Any) -> BatchState:
    """A planned batch as the map operator defers it, and the try's record saying so."""
    store = config.store()
    state, objects, local = plan_batch(
        JobRequest(func=func, output_dir=store.uri("outputs/sweep")), list(range(INPUTS)),
        "single", store, config=config, max_concurrent=2, retries=0, fail_fast=False,
        signing_secret=deployment_secret(),
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    state.driver = "deferral-1"
    record = TaskRecord(kind="batch", mode=DEFERRED, try_number=1, group_id=state.group_id)
    write_record(store, IDENTITY, record, deployment_secret())
    return state


def _trigger(config: KineticConfig, state: BatchState, not_before: float) -> KineticBatchTrigger:
    return KineticBatchTrigger(
        state=state.to_dict(), config=config_to_json(config), poll_interval=0.05,
        log_bytes_per_poll=0, not_before=not_before, drive=True,
        end_task=EndTask("on_success", dict(IDENTITY)).to_dict(),
    )  # fmt: skip


def _events(trigger: KineticBatchTrigger) -> list[Any]:
    async def run() -> list[Any]:
        return [event async for event in trigger.run()]

    return asyncio.run(run())


def test_a_batch_whose_children_all_succeeded_ends_its_task_in_the_trigger(
    config: KineticConfig, backend: Any, pushed: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds: list[float] = []

    async def held(not_before: float) -> None:
        holds.append(not_before)

    monkeypatch.setattr("airflow_provider_kinetic.triggers.batch.hold", held)
    store = config.store()
    state = _deferred(config, triple)

    [event] = _events(_trigger(config, state, not_before=1e12))  # its normal event: held

    assert isinstance(event, TaskSuccessEvent) and not event.xcoms and holds == []
    assert [key for key, _ in pushed] == ["return_value", "kinetic_batch", "kinetic_usage"]
    values = dict(pushed)
    assert values["return_value"] == [0, 3, 6]
    assert values["kinetic_batch"]["counts"]["succeeded"] == INPUTS
    assert values["kinetic_batch"]["group_id"] == state.group_id
    # The worker's finish: the record holds the values, history says how the batch
    # ended, the children's artifacts went by the policy, the ended state was saved.
    record = read_record(store, IDENTITY, deployment_secret())
    assert record.delivered and record.returned
    assert record.xcoms["return_value"] == [0, 3, 6]
    entry = history.read(store, state.group_id)
    assert entry["state"] == "SUCCEEDED" and entry["children"]["succeeded"] == INPUTS
    children = entry["child_jobs"]
    assert len(children) == INPUTS and not any(store.list(f"{job}/") for job in children)
    ended = delivered_state(store, state.group_id, deployment_secret())
    assert ended is not None and len(ended.done) == INPUTS

    # A trigger of the same try re-created after the event was lost: the same values,
    # nothing run again.
    pushed.clear()
    [again] = _events(_trigger(config, state, not_before=0))
    assert isinstance(again, TaskSuccessEvent)
    assert dict(pushed)["return_value"] == [0, 3, 6]
    assert history.read(store, state.group_id)["child_jobs"] == children


def test_a_batch_with_a_failed_child_resumes_its_task_on_a_worker(
    config: KineticConfig, backend: Any, pushed: list
) -> None:
    """The worker raises ``KineticBatchFailed`` (or returns error values), which Airflow
    retries: nothing of the batch was finished here."""
    store = config.store()
    state = _deferred(config, triple_but_one)
    before = read_record(store, IDENTITY, deployment_secret())

    [event] = _events(_trigger(config, state, not_before=0))

    assert not isinstance(event, TaskSuccessEvent)
    assert event.payload["status"] == "finished"
    assert pushed == []
    assert read_record(store, IDENTITY, deployment_secret()) == before
    assert history.read(store, state.group_id).get("state") not in ("SUCCEEDED", "FAILED")
