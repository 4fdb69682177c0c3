"""A driven batch survives losing its driver at the worst moments, on real local jobs.

The trigger that drives a deferred batch saves its state at most every few seconds, so
a triggerer that dies leaves children the saved state does not know about: launched
(or even finished, their Jobs deleted) after the save.  A new driver starting from
the saved state must adopt those children by their derived job ids, never create
them again, and count a finished child that is gone by its authentic result.
"""

from __future__ import annotations

import copy
import os
import time

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import launchrecord
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.resume import load_driven, save_driven
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.signing import ResultKey
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.storage import LocalStore

SECRET = os.urandom(32)


def triple(x: int) -> int:
    return 3 * x


def _plan(tmp_path, n: int) -> tuple[BatchState, KineticConfig, LocalBackend, LocalStore]:
    store = LocalStore(str(tmp_path / "store"))
    config = KineticConfig(backend="local", root=store.bucket)
    request = JobRequest(func=triple, output_dir=store.uri("outputs/drive"))
    state, objects, local = plan_batch(
        request, list(range(n)), "single", store, config=config,
        max_concurrent=2, retries=0, fail_fast=False, signing_secret=SECRET,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    return state, config, LocalBackend(store.bucket), store


def _key(handle):
    return ResultKey.for_job(SECRET, handle.job_id, handle.result_key_id)


def _until_ended(state, backend, store, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        reports = backend.batch_status(state.group_id, list(state.active.values()))
        if all(r.status.is_terminal for r in reports.values()):
            return reports
        assert time.monotonic() < deadline, reports
        backend.wait(list(state.active.values()), 0.2)


def test_a_new_driver_adopts_what_the_dead_one_launched_and_finished(tmp_path, monkeypatch) -> None:
    state, config, backend, store = _plan(tmp_path, 5)
    record = launchrecord.launches_key(state.group_id)
    written: list[str] = []
    write = store.write_bytes

    def counted(key, *args, **kwargs):
        written.append(key)
        return write(key, *args, **kwargs)

    monkeypatch.setattr(store, "write_bytes", counted)
    state.driver = "deferral-1"
    save_driven(store, state, SECRET)  # what the trigger saved early on
    saved = copy.deepcopy(load_driven(store, BatchState.from_dict(state.to_dict()), SECRET))
    saved.seq = 0  # the trigger's kwargs: older than any save

    # The first driver launches two children, sees them end, folds them in (deleting
    # their jobs' state, as a release would), launches two more, and dies unsaved.
    batchlaunch.launch(state, config, backend, store, SECRET, probe=True)
    first = dict(state.active)
    reports = _until_ended(state, backend, store)
    batchrun.observe(state, reports, backend, store, _key)
    for handle in first.values():
        backend.release(handle)  # gone: only their results are left
    batchlaunch.launch(state, config, backend, store, SECRET, probe=True)
    second = dict(state.active)
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    jobs_before = sorted(os.listdir(os.path.join(store.bucket, ".local-jobs")))

    # The new driver starts from the saved state: it knows none of this.
    again = load_driven(store, BatchState.from_dict(saved.to_dict()), SECRET)
    assert again.seq == 1 and not again.active and len(again.queue) == 5
    batchlaunch.launch(again, config, backend, store, SECRET, probe=True)
    assert {i: h.job_id for i, h in again.active.items()} == {
        i: h.job_id for i, h in first.items()
    }  # the same job ids: adopted, not created again
    assert sorted(os.listdir(os.path.join(store.bucket, ".local-jobs"))) == jobs_before
    # (A released job reads NOT_FOUND once its supervisor, which may still be exiting,
    # is gone.)
    statuses = _until_ended(again, backend, store)
    assert {r.status for r in statuses.values()} == {JobStatus.NOT_FOUND}
    batchrun.observe(again, statuses, backend, store, _key)  # gone, with their results
    assert {again.done[i] for i in first} == {SUCCEEDED}
    deadline = time.monotonic() + 180
    while not again.finished:
        batchlaunch.launch(again, config, backend, store, SECRET, probe=True)
        reports = _until_ended(again, backend, store)
        batchrun.observe(again, reports, backend, store, _key)
        assert time.monotonic() < deadline
    assert {again.jobs[i] for i in second} == {h.job_id for h in second.values()}
    values, failures = batchoutcomes.gather(
        again, store, result_key=lambda job: ResultKey.for_job(SECRET, job)
    )
    assert failures == {} and values == [3 * i for i in range(5)]
    # Five inputs, five jobs: nothing ran twice.
    assert len({again.jobs[i] for i in range(5)}) == 5
    assert all(again.launches[i] == 1 for i in range(5))
    # Every create intent of both drivers in one write of the launch record (three
    # waves of launches, five children): not an object per child.
    assert written.count(record) == 1
    assert launchrecord.LaunchRecord.read(store, state.group_id).intended == dict.fromkeys(
        range(5), 1
    )
    assert len([k for k in written if k.endswith("/handle.json")]) == 5


def test_a_save_of_another_deferral_is_never_taken(tmp_path) -> None:
    state, _, _, store = _plan(tmp_path, 2)
    state.driver = "deferral-1"
    state.queue = [1]
    save_driven(store, state, SECRET)
    other = BatchState.from_dict({**state.to_dict(), "driver": "deferral-2", "seq": 0})
    other.queue = [0, 1]
    assert load_driven(store, other, SECRET) is other  # another deferral's save: ignored
    mine = BatchState.from_dict({**state.to_dict(), "seq": 0})
    assert load_driven(store, mine, SECRET).queue == [1]
