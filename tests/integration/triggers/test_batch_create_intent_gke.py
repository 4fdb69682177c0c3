"""A driven batch's child is created once, whatever moment its driver died at (GKE, the
Kubernetes API double; issue 37, case 13).

Before a wave of creates the batch's launch record (``_groups/{id}/launches.json``)
names every child about to be created (its create intent: one write per wave, not
per child), and a child's ``handle.json`` is written once its create was answered.
A driver restarted from a state saved before the children's launch tells, by the
child's derived job id:

* no intent, or the intent alone (it died before the create): created now, once;
* created and running: adopted, never created again, never marked FAILED;
* created, failed and its Job deleted (no object left, no result): not created again
  under its id; the input ends FAILED, or is retried as ``retries`` allows;
* an input that moved on (its old job preempted and deleted, its next one running):
  followed to the running job, not marked FAILED for the job it left.

Every test counts the Job creates the double saw.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import launchrecord
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.state import FAILED, SUCCEEDED, BatchState
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.signing import ResultKey
from airflow_provider_kinetic.core.spec.handles import (
    REASON_PREEMPTED,
    JobStatus,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.triggers.batch_drive import BatchDriver
from tests.fixtures.ended_jobs import put_result
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures
    JOBS,
    connections,
    google_token,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # the backend calls it synchronously


def once(i: int) -> int:
    return i


class DriverDied(BaseException):
    """The triggerer process ending mid-call (nothing of kinetic's runs after it)."""


def _batch(retries: int = 0) -> tuple[BatchState, BatchState, Any, Any, Any]:
    """One input planned and started, as the operator leaves it; the state as saved
    before any launch (what a restarted trigger starts from), the hook's parts and a
    backend of the first driver's own."""
    hook = KineticHook("kinetic_gke")
    config, store, secret = hook.get_config(), hook.get_store(), deployment_secret()
    state, objects, local = plan_batch(
        JobRequest(func=once, output_dir=store.uri(f"outputs/intent-{uuid.uuid4().hex}")),
        [7], "single", store, config=config, max_concurrent=1, retries=retries,
        fail_fast=False, signing_secret=secret,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    state.driver = "deferral-1"
    saved = BatchState.from_dict(state.to_dict())
    return state, saved, config, store, hook.get_backend(state.backend)


def _restarted(config: Any, store: Any) -> BatchDriver:
    """A new driver, with a backend of its own (the dead driver's is gone with it)."""
    backend = KineticHook("kinetic_gke").get_backend("gke")
    log = logging.getLogger("test.batch_create_intent")
    return BatchDriver(config, store, deployment_secret(), backend, log, result_key)


def _creates(api: Any) -> int:
    return len(api.sent("POST", JOBS))


def _poll(driver: BatchDriver, state: BatchState) -> dict[str, StatusReport]:
    return driver.backend.batch_status(state.group_id, list(state.active.values()))


def _fail_and_delete(api: Any, backend: Any, handle: Any) -> None:
    """Its pod killed (no result written), the Job failed, then deleted."""
    path = f"{JOBS}/{handle.k8s_name or backend.object_name(handle.job_id)}"
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    api.patch_status(path, {"failed": 1, "conditions": [failed]})

    async def delete(d: Any) -> None:
        resp = await d.delete(path)
        assert resp.status in (200, 202), await resp.text()

    api.call(delete)
    assert api.read(path) is None


@pytest.mark.parametrize("dies", ["before its intent", "between its intent and its create"])
def test_a_child_never_created_is_created_once(
    connections,  # noqa: F811 - the fixture
    api,
    monkeypatch,
    dies: str,
) -> None:
    state, saved, config, store, backend = _batch()
    job_id = batchlaunch.child_job_id(state.group_id, 0, 1)

    def died(*_: Any) -> None:
        raise DriverDied(job_id)

    with monkeypatch.context() as patch, pytest.raises(DriverDied):
        if dies == "before its intent":
            patch.setattr(launchrecord.LaunchRecord, "write", died)
        else:
            patch.setattr(backend, "submit", died)  # this driver's backend only
        batchlaunch.launch(state, config, backend, store, deployment_secret(), probe=True)
    intended = launchrecord.LaunchRecord.read(store, state.group_id).intended
    assert intended == ({} if dies == "before its intent" else {0: 1})
    assert not store.exists(artifact_key(job_id, "handle.json"))
    assert _creates(api) == 0

    driver = _restarted(config, store)
    again = driver.resume(saved)
    driver.step(again, {})
    driver.step(again, _poll(driver, again))  # a second poll creates nothing more
    assert list(again.active) == [0] and again.jobs[0] == job_id and not again.done
    assert _creates(api) == 1  # created now, exactly once
    assert len(api.sent("POST", "/secrets")) == 1
    assert store.exists(artifact_key(job_id, "handle.json"))  # its create was answered


def test_a_running_child_is_adopted(
    connections,  # noqa: F811 - the fixture
    api,
) -> None:
    state, saved, config, store, backend = _batch()
    # The first driver creates the child and dies before it saves.
    batchlaunch.launch(state, config, backend, store, deployment_secret(), probe=True)
    (handle,) = state.active.values()
    assert _creates(api) == 1

    driver = _restarted(config, store)
    again = driver.resume(saved)
    driver.step(again, {})
    reports = _poll(driver, again)
    assert reports[handle.job_id].status in (JobStatus.PENDING, JobStatus.RUNNING)
    driver.step(again, reports)
    driver.step(again, _poll(driver, again))
    assert again.jobs[0] == handle.job_id and list(again.active) == [0]
    assert again.done == {} and again.attempts[0] == 1
    assert _creates(api) == 1  # adopted: never created again


@pytest.mark.parametrize("retries", [0, 1])
def test_a_child_created_failed_and_deleted_is_not_created_again(
    connections,  # noqa: F811 - the fixture
    api,
    retries: int,
) -> None:
    state, saved, config, store, backend = _batch(retries)
    # The first driver creates the child, and dies before it saves or observes it.
    batchlaunch.launch(state, config, backend, store, deployment_secret(), probe=True)
    (handle,) = state.active.values()
    assert _creates(api) == 1
    _fail_and_delete(api, backend, handle)

    driver = _restarted(config, store)
    again = driver.resume(saved)
    driver.step(again, {})
    assert again.jobs[0] == handle.job_id and list(again.active) == [0]
    assert _creates(api) == 1  # adopted as it ended: never created again under its id
    reports = _poll(driver, again)
    assert reports[handle.job_id].status is JobStatus.NOT_FOUND
    driver.step(again, reports)
    if retries:  # its one retry, under the next id, once
        assert list(again.active) == [0] and again.launches[0] == 2
        assert again.jobs[0] == batchlaunch.child_job_id(again.group_id, 0, 2)
        assert _creates(api) == 2
        driver.step(again, _poll(driver, again))
        assert _creates(api) == 2
        return
    assert again.finished and again.done == {0: FAILED}
    assert _creates(api) == 1
    _, failures = batchoutcomes.gather(
        again, store, result_key=lambda job: ResultKey.for_job(deployment_secret(), job)
    )
    message = str(failures[0])
    assert handle.job_id in message, message
    assert "submission failed" not in message and "never ran" not in message, message


def test_an_input_that_moved_on_is_followed_not_failed(
    connections,  # noqa: F811 - the fixture
    api,
) -> None:
    state, _, config, store, backend = _batch()
    secret = deployment_secret()
    batchlaunch.launch(state, config, backend, store, secret, probe=True)
    (first,) = state.active.values()
    saved = BatchState.from_dict(state.to_dict())  # the trigger's last save: launch 1 runs
    # The first driver sees launch 1 preempted (its Job deleted as it folds it in), and
    # creates launch 2, which runs; then it dies unsaved.
    preempted = StatusReport(JobStatus.FAILED, REASON_PREEMPTED, "node reclaimed")
    batchrun.observe(state, {first.job_id: preempted}, backend, store)
    assert state.queue == [0] and state.preemptions == {0: 1}
    batchlaunch.launch(state, config, backend, store, secret, probe=True)
    (second,) = state.active.values()
    assert second.job_id == batchlaunch.child_job_id(state.group_id, 0, 2)
    assert _creates(api) == 2

    driver = _restarted(config, store)
    again = driver.resume(saved)
    assert again.active[0].job_id == first.job_id  # it knows launch 1 only
    reports = _poll(driver, again)
    assert reports[first.job_id].status is JobStatus.NOT_FOUND
    driver.step(again, reports)
    assert again.done == {}  # not FAILED (retries=0) for the job it left
    assert list(again.active) == [0] and again.jobs[0] == second.job_id
    # counted as the dead driver counted them: a preemption, not an attempt
    assert (
        (again.attempts, again.preemptions)
        == (state.attempts, state.preemptions)
        == (
            {0: 1},
            {0: 1},
        )
    )
    driver.step(again, _poll(driver, again))
    assert list(again.active) == [0] and again.done == {}
    assert _creates(api) == 2  # launch 2 adopted, never created again


def _older_save(saved: BatchState) -> BatchState:
    """``saved`` as a version before create intents saved it: no ``intended`` on the
    wire (nor ``pre_intent``, which this version adds)."""
    wire = saved.to_dict()
    wire.pop("intended")
    wire.pop("pre_intent", None)
    return BatchState.from_dict(wire)


def _succeed_and_delete(api: Any, backend: Any, handle: Any, store: Any) -> None:
    """Its pod wrote its result (signed, as a runner signs it), the Job succeeded and
    was deleted (the older driver folded it in, then died before it saved)."""
    put_result(store, handle, 7)
    path = f"{JOBS}/{handle.k8s_name or backend.object_name(handle.job_id)}"
    done = {"type": "Complete", "status": "True"}
    api.patch_status(path, {"succeeded": 1, "conditions": [done]})

    async def delete(d: Any) -> None:
        resp = await d.delete(path)
        assert resp.status in (200, 202), await resp.text()

    api.call(delete)
    assert api.read(path) is None


@pytest.mark.parametrize("child", ["running", "succeeded and deleted", "never created"])
def test_an_older_drivers_children_are_probed_not_created_again(
    connections,  # noqa: F811 - the fixture
    api,
    child: str,
) -> None:
    """A batch an older version drove: its launch record holds no create intents and
    its saved state none either.  A driver of this version that resumes it probes each
    launch no record names, by its derived job id, before it creates it: a child there
    and proven its own is adopted, one that ended is known by its result, and only one
    the older driver never created is created (once)."""
    state, saved, config, store, backend = _batch()
    job_id = batchlaunch.child_job_id(state.group_id, 0, 1)
    if child != "never created":
        # The older driver: it created the child without recording an intent, and
        # died before it saved (its last save still has the input queued).
        batchlaunch.launch(state, config, backend, store, deployment_secret())
        (handle,) = state.active.values()
        assert handle.job_id == job_id and _creates(api) == 1
        if child == "succeeded and deleted":
            _succeed_and_delete(api, backend, handle, store)
    assert launchrecord.LaunchRecord.read(store, state.group_id).intended == {}

    driver = _restarted(config, store)
    again = driver.resume(_older_save(saved))
    assert again.pre_intent and again.queue == [0]
    driver.step(again, {})
    assert again.jobs[0] == job_id and list(again.active) == [0]
    assert _creates(api) == 1  # adopted, or (never created) created now: once
    reports = _poll(driver, again)
    driver.step(again, reports)
    assert _creates(api) == 1
    if child == "succeeded and deleted":
        assert reports[job_id].status is JobStatus.NOT_FOUND
        assert again.done == {0: SUCCEEDED}  # its result, not a second run
        values, failures = batchoutcomes.gather(
            again, store, result_key=lambda job: ResultKey.for_job(deployment_secret(), job)
        )
        assert failures == {} and values == [7], (values, failures)
    else:
        assert again.done == {} and again.attempts[0] == 1
    # Later relaunch waves of this driver are its own: recorded, never probed again.
    assert launchrecord.LaunchRecord.read(store, again.group_id).intended == {0: 1}
