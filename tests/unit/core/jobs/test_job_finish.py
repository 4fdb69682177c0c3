"""core.jobs.finish: one ended job finished in one order, whoever finishes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import checkpoint_key
from airflow_provider_kinetic.core.jobs.cleanup import ALWAYS, NEVER, ON_SUCCESS
from airflow_provider_kinetic.core.jobs.finish import describe_failure, finish_job, release_held
from airflow_provider_kinetic.core.jobs.resultref import make_result_ref
from airflow_provider_kinetic.core.jobs.taskrecord import CANCEL_MARKER
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import result_key
from tests.fixtures import records
from tests.fixtures.ended_jobs import EndedBackend, put_result

IDENTITY = {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1}


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(str(tmp_path / "root"))


@pytest.fixture
def backend(tmp_path: Path) -> EndedBackend:
    return EndedBackend(str(tmp_path / "root"))


@pytest.fixture
def job(store: LocalStore) -> JobHandle:
    return records.handle("job-00000001", store.bucket)


def finish(store, backend, job, status, **kw):
    kw.setdefault("cleanup", ON_SUCCESS)
    return finish_job(
        store,
        backend,
        job,
        StatusReport(status, kw.pop("reason", None)),
        result_key=result_key(job),
        **kw,
    )


def test_the_value_is_read_and_delivered_before_anything_is_deleted(store, backend, job):
    put_result(store, job, value={"answer": 42})
    seen = []

    def deliver(value, blob):
        # Delivered while the job is whole: its result, its backend state, its job.
        seen.append((value, store.exists(f"{job.job_id}/result.pkl"), list(backend.events)))
        return value

    done = finish(store, backend, job, JobStatus.SUCCEEDED, deliver=deliver)

    assert seen == [({"answer": 42}, True, [])]
    assert done.succeeded and done.error is None and done.value == {"answer": 42}
    # Then its log archived, its state released, its artifacts deleted, its job deleted.
    assert backend.events == [
        ("read_logs", job.job_id),
        ("release", job.job_id),
        ("cancel", job.job_id),
    ]
    assert done.removed > 0 and not store.list(f"{job.job_id}/")
    entry = history.read(store, job.job_id)
    assert entry["state"] == "SUCCEEDED"
    assert entry["artifacts"]["state"] == "deleted"
    assert history.read_log(store, job.job_id) == "a line\n"


def test_a_failed_job_returns_its_remote_error_and_keeps_its_artifacts(store, backend, job):
    put_result(store, job, error=ValueError("bad input"))
    delivered = []

    done = finish(
        store, backend, job, JobStatus.FAILED, reason="exit code 1", deliver=delivered.append
    )

    assert not done.succeeded and delivered == []
    assert isinstance(done.error, ValueError) and done.failure == "ValueError: bad input"
    entry = history.read(store, job.job_id)
    assert (entry["state"], entry["reason"]) == ("FAILED", "ValueError: bad input")
    assert entry["artifacts"]["state"].startswith("kept: the job failed")
    assert store.exists(f"{job.job_id}/result.pkl")
    assert backend.events[-1] == ("cancel", job.job_id)  # the Job goes whatever the outcome


def test_a_cancel_requested_makes_the_failure_cancelled(store, backend, job):
    put_result(store, job, error=RuntimeError("stopped"))
    store.write_bytes(f"{job.job_id}/{CANCEL_MARKER}", b"")

    done = finish(store, backend, job, JobStatus.FAILED, cleanup=ALWAYS)

    assert done.error is not None
    assert history.read(store, job.job_id)["state"] == history.CANCELLED
    assert not store.list(f"{job.job_id}/")  # "always": however it ended


def test_a_succeeded_job_whose_result_cannot_be_read_is_left_for_a_retry(store, backend, job):
    put_result(store, job, value=1)
    store.write_bytes(f"{job.job_id}/result.pkl.sig", b"forged")

    done = finish(store, backend, job, JobStatus.SUCCEEDED, cleanup=ALWAYS)

    assert done.error is not None and not done.succeeded
    entry = history.read(store, job.job_id)
    assert entry["state"] == "SUCCEEDED" and entry["reason"].startswith("not collected: ")
    assert "artifacts" not in entry  # the policy was not applied
    assert store.exists(f"{job.job_id}/result.pkl")
    assert backend.events == [("cancel", job.job_id)]


def test_a_delivery_that_fails_leaves_the_job_as_it_is(store, backend, job):
    put_result(store, job, value=1)

    def deliver(value, blob):
        raise TypeError("XCom refused it")

    with pytest.raises(TypeError, match="XCom refused it"):
        finish(store, backend, job, JobStatus.SUCCEEDED, cleanup=ALWAYS, deliver=deliver)

    assert backend.events == [] and store.exists(f"{job.job_id}/result.pkl")
    assert history.read(store, job.job_id) is None


def test_a_result_a_reference_points_at_is_kept(store, backend, job):
    put_result(store, job, value="big")
    uri = store.uri(f"{job.job_id}/result.pkl")

    def deliver(value, blob):
        return make_result_ref(uri, value, blob)

    done = finish(store, backend, job, JobStatus.SUCCEEDED, deliver=deliver)

    assert done.removed == 0 and store.exists(f"{job.job_id}/result.pkl")
    assert history.read(store, job.job_id)["artifacts"]["state"].startswith("kept: an XCom")


@pytest.mark.parametrize("mode", [ON_SUCCESS, ALWAYS])
def test_held_artifacts_stay_until_released(store, backend, job, mode):
    """``hold``: an operator's try keeps what the policy deletes until its record says
    it returned the value; a try ended in between leaves it for the next to collect."""
    put_result(store, job, value=3)

    done = finish(store, backend, job, JobStatus.SUCCEEDED, cleanup=mode, hold=True)

    assert done.held and done.removed == 0 and store.exists(f"{job.job_id}/result.pkl")
    artifacts = history.read(store, job.job_id)["artifacts"]
    assert artifacts["state"].startswith("held") and artifacts["objects"] > 0
    assert backend.events[-2:] == [("release", job.job_id), ("cancel", job.job_id)]

    release_held(store, done, mode)

    assert not done.held and done.removed > 0 and not store.list(f"{job.job_id}/")
    artifacts = history.read(store, job.job_id)["artifacts"]
    assert artifacts == {"state": "deleted", "objects": 0, "bytes": 0, "policy": mode}


def test_nothing_is_held_that_the_policy_keeps(store, backend, job):
    put_result(store, job, value=3)
    kept = finish(store, backend, job, JobStatus.SUCCEEDED, cleanup=NEVER, hold=True)
    other = records.handle("job-00000002", store.bucket)
    put_result(store, other, error=ValueError("bad"))
    failed = finish(store, backend, other, JobStatus.FAILED, hold=True)

    assert not kept.held and not failed.held
    release_held(store, kept, NEVER)
    release_held(store, failed, ON_SUCCESS)
    assert store.exists(f"{job.job_id}/result.pkl") and store.exists(f"{other.job_id}/result.pkl")


def test_a_result_collected_after_its_job_is_gone_is_a_success(store, backend, job):
    """A later try collects a job whose backend state is gone (NOT_FOUND) from its
    result: history says it succeeded, not that it was not found."""
    put_result(store, job, value=3)

    done = finish(store, backend, job, JobStatus.NOT_FOUND, reason="no such local job")

    assert done.succeeded and done.value == 3
    entry = history.read(store, job.job_id)
    assert (entry["state"], entry["reason"]) == ("SUCCEEDED", None)


@pytest.mark.parametrize(("mode", "removed"), [(ON_SUCCESS, True), (NEVER, False)])
def test_a_delivered_tasks_checkpoints_go_with_the_policy(store, backend, job, mode, removed):
    put_result(store, job, value=1)
    checkpoint = checkpoint_key(IDENTITY, job.job_id) + "state.bin"
    store.write_bytes(checkpoint, b"x")

    finish(store, backend, job, JobStatus.SUCCEEDED, cleanup=mode, checkpoints_of=IDENTITY)

    assert store.exists(checkpoint) is not removed


def test_unread_the_status_decides(store, backend, job):
    """``read_value=False`` (nobody wants the value: a sensor without return_result):
    no result read, the status says how it ended."""
    delivered = []
    ok = finish(
        store, backend, job, JobStatus.SUCCEEDED, read_value=False, deliver=delivered.append
    )
    other = records.handle("job-00000002", store.bucket)
    failed = finish(store, backend, other, JobStatus.FAILED, reason="exit code 3", read_value=False)

    assert ok.succeeded and ok.value is None and delivered == []
    assert not failed.succeeded and failed.error is None
    assert history.read(store, other.job_id)["reason"] == "exit code 3"


def test_describe_failure_names_the_type_unless_the_remote_one_is_in_the_message():
    class Remote(RuntimeError):
        remote_type = "mylib.Oops"

    assert describe_failure(ValueError("v")) == "ValueError: v"
    assert describe_failure(Remote("mylib.Oops: o")) == "mylib.Oops: o"


def test_a_pod_failed_after_its_function_returned_delivers_the_result(store, backend, job):
    """GKE reclaimed the node while the runner exited: the pod reads Failed (Preempted)
    but the function had returned and its signed result is whole.  That result is the
    job's value; before, the task failed with "no result payload" (and its Airflow
    retry ran the function again)."""
    put_result(store, job, value={"answer": 42})
    done = finish(store, backend, job, JobStatus.FAILED, reason="Preempted")
    assert done.succeeded and done.error is None and done.value == {"answer": 42}
    entry = history.read(store, job.job_id)
    assert entry["state"] == "SUCCEEDED" and "Preempted" in entry["reason"]
