"""A driven batch's child is created once, whatever moment its driver died at (GKE, the
Kubernetes API double).

A child's ``handle.json`` is written before its create (the intent) and a create
marker once the API answered.  A driver restarted from a state saved before the
child's launch must tell the two apart by the child's derived job id:

* the intent alone (the driver died before its create): the child is created now,
  exactly once;
* created, then failed and its Job deleted (no object left, no result): the child is
  not created again; the input ends FAILED with what is known of its failure.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.state import FAILED, BatchState
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.signing import ResultKey
from airflow_provider_kinetic.core.jobs.submit import CREATED
from airflow_provider_kinetic.core.spec.handles import JobStatus, artifact_key
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.triggers.batch_drive import BatchDriver
from tests.integration.test_gke_dags import (  # noqa: F401 - fixtures
    JOBS,
    connections,
    google_token,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # the backend calls it synchronously


def once(i: int) -> int:
    return i


class DriverDied(BaseException):
    """The triggerer process ending mid-call (nothing of kinetic's runs after it)."""


def _batch() -> tuple[BatchState, BatchState, Any, Any]:
    """One input planned and started, as the operator leaves it; the state as saved
    before any launch (what a restarted trigger starts from), the hook's parts."""
    hook = KineticHook("kinetic_gke")
    config, store, secret = hook.get_config(), hook.get_store(), deployment_secret()
    state, objects, local = plan_batch(
        JobRequest(func=once, output_dir=store.uri(f"outputs/intent-{uuid.uuid4().hex}")),
        [7], "single", store, config=config, max_concurrent=1, retries=0, fail_fast=False,
        signing_secret=secret,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    saved = BatchState.from_dict(state.to_dict())
    return state, saved, config, store


def _driver(hook_backend: Any, config: Any, store: Any) -> BatchDriver:
    log = logging.getLogger("test.batch_create_intent")
    return BatchDriver(config, store, deployment_secret(), hook_backend, log, result_key)


def _job_posts(api: Any) -> list[Any]:
    return api.sent("POST", JOBS)


def test_a_child_whose_create_never_happened_is_created_once(
    connections,  # noqa: F811 - the fixture
    api,
) -> None:
    state, saved, config, store = _batch()
    backend = KineticHook("kinetic_gke").get_backend(state.backend)

    def dies(spec: Any) -> None:
        raise DriverDied(spec.job_id)

    # The first driver writes the child's intent and dies before its create.
    backend.submit = dies  # type: ignore[method-assign] - this driver's backend only
    with pytest.raises(DriverDied):
        batchlaunch.launch(state, config, backend, store, deployment_secret(), probe=True)
    job_id = batchlaunch.child_job_id(state.group_id, 0, 1)
    assert store.exists(artifact_key(job_id, "handle.json"))
    assert not store.exists(artifact_key(job_id, CREATED))
    assert _job_posts(api) == []

    # The restarted driver, from the state saved before the launch.
    driver = _driver(KineticHook("kinetic_gke").get_backend(state.backend), config, store)
    again = driver.resume(saved)
    driver.step(again, {})
    driver.step(again, {})  # a second poll probes nothing more
    assert list(again.active) == [0] and again.jobs[0] == job_id
    assert len(_job_posts(api)) == 1  # created now, exactly once
    assert len(api.sent("POST", "/secrets")) == 1
    assert store.exists(artifact_key(job_id, CREATED))


def test_a_child_created_failed_and_deleted_is_not_created_again(
    connections,  # noqa: F811 - the fixture
    api,
) -> None:
    state, saved, config, store = _batch()
    backend = KineticHook("kinetic_gke").get_backend(state.backend)

    # The first driver creates the child, and dies before it saves or observes it.
    batchlaunch.launch(state, config, backend, store, deployment_secret(), probe=True)
    (handle,) = state.active.values()
    assert store.exists(artifact_key(handle.job_id, CREATED))
    assert len(_job_posts(api)) == 1
    path = f"{JOBS}/{handle.k8s_name or backend.object_name(handle.job_id)}"
    # Its pod is killed (no result written), the Job fails, and is deleted.
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    api.patch_status(path, {"failed": 1, "conditions": [failed]})

    async def delete(d: Any) -> None:
        resp = await d.delete(path)
        assert resp.status in (200, 202), await resp.text()

    api.call(delete)
    assert api.read(path) is None

    # The restarted driver, from the state saved before the launch.
    driver = _driver(KineticHook("kinetic_gke").get_backend(state.backend), config, store)
    again = driver.resume(saved)
    driver.step(again, {})
    assert again.jobs[0] == handle.job_id and list(again.active) == [0]
    assert len(_job_posts(api)) == 1  # adopted as it ended: never created again
    reports = driver.backend.batch_status(again.group_id, list(again.active.values()))
    assert reports[handle.job_id].status is JobStatus.NOT_FOUND
    driver.step(again, reports)
    assert again.finished and again.done == {0: FAILED}
    assert len(_job_posts(api)) == 1
    _, failures = batchoutcomes.gather(
        again, store, result_key=lambda job: ResultKey.for_job(deployment_secret(), job)
    )
    message = str(failures[0])
    assert handle.job_id in message and "failed (NotFound)" in message, message
    assert "submission failed" not in message and "never ran" not in message, message
