"""Batch scheduling rules (core.batch.launch, core.batch.run) on hand-made states:
retries, preemption, fail-fast, ordering.  The store is a real LocalStore; the backend
records calls."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.k8s.status import REASON_PREEMPTED
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.logs import failure_summary
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.errors import KineticInternalError
from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.records import batch_state as state
from tests.fixtures.records import handle


class Recorder(LocalBackend):
    """Records cancels; any status query is a test failure (observe uses its reports)."""

    def __init__(self) -> None:
        super().__init__("/nonexistent")
        self.cancelled: list[str] = []

    def submit(self, spec: Any) -> None:
        raise AssertionError("not used")

    def status(self, handle: JobHandle) -> StatusReport:
        raise AssertionError("observe must use the reports it is given")

    def cancel(self, handle: JobHandle) -> None:
        self.cancelled.append(handle.job_id)


def result(store: LocalStore, job: str, ok: bool, value: Any = None) -> None:
    exc = None if ok else ValueError(f"{job} broke")
    blob, _ = dump_result(make_result(success=ok, result=value, exception=exc, traceback="tb"))
    store.write_bytes(f"{job}/result.pkl", blob)


FAILED = StatusReport(JobStatus.FAILED, "NonZeroExit")


def test_retry_requeues_then_gives_up(tmp_path):
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(3, {0: "job-a", 1: "job-b"}, retries=1)
    result(store, "job-a", False)
    assert batchrun.observe(s, {"job-a": FAILED}, backend, store) == []
    assert s.queue[0] == 0 and 0 not in s.done and backend.cancelled == ["job-a"]
    s.active[0], s.attempts[0] = handle("job-a2"), 2  # as launch() would
    result(store, "job-a2", False)
    assert batchrun.observe(s, {"job-a2": FAILED}, backend, store) == [0]
    assert s.done[0] == "FAILED"


def test_preemption_is_retried_apart_from_retries(tmp_path):
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(1, {0: "job-p"}, retries=0)
    preempted = StatusReport(JobStatus.FAILED, REASON_PREEMPTED)
    batchrun.observe(s, {"job-p": preempted}, backend, store)
    assert s.queue == [0] and s.preemptions == {0: 1} and s.attempts[0] == 0
    # A preemption-like reason with a failure payload is the function's fault: no retry.
    s.active[0], s.attempts[0] = handle("job-q"), 1
    result(store, "job-q", False)
    batchrun.observe(s, {"job-q": preempted}, backend, store)
    assert s.done[0] == "FAILED"


def test_fail_fast_cancels_active_and_skips_queue(tmp_path):
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(6, {0: "job-0", 1: "job-1", 2: "job-2"}, fail_fast=True)
    result(store, "job-1", False)
    running = StatusReport(JobStatus.RUNNING)
    batchrun.observe(s, {"job-0": running, "job-1": FAILED, "job-2": running}, backend, store)
    assert s.stopped and batchrun.is_finished(s)
    assert s.done == {
        1: "FAILED",
        0: "CANCELLED",
        2: "CANCELLED",
        3: "NOT_SUBMITTED",
        4: "NOT_SUBMITTED",
        5: "NOT_SUBMITTED",
    }
    assert sorted(backend.cancelled) == ["job-0", "job-1", "job-2"]
    c = batchrun.counts(s)
    assert (c["failed"], c["cancelled"], c["not_submitted"]) == (1, 2, 3)


@pytest.mark.parametrize("second_attempt", [1, 2])
def test_fail_fast_with_two_failures_in_one_poll_fails_the_batch_naming_both(
    tmp_path, second_attempt
):
    """Two children seen failed in one poll: the first stops the batch (cancelling
    its running siblings); the second is still a failure of its own, not a sibling
    the stop cancelled (it was one: ``KeyError`` on the next index of the poll), and
    not retried (the batch stopped) even with a retry left."""
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(4, {0: "job-0", 1: "job-1", 2: "job-2"}, fail_fast=True, retries=1)
    s.attempts.update({0: 2, 1: second_attempt})  # inputs[0] on its last try
    result(store, "job-0", False)
    result(store, "job-1", False)
    running = StatusReport(JobStatus.RUNNING)
    reports = {"job-0": FAILED, "job-1": FAILED, "job-2": running}
    finished = batchrun.observe(s, reports, backend, store)
    assert sorted(finished) == [0, 1] and s.stopped and batchrun.is_finished(s)
    assert s.done == {0: "FAILED", 1: "FAILED", 2: "CANCELLED", 3: "NOT_SUBMITTED"}
    assert batchlaunch.unaccounted(s) == [] and sorted(s.order) == [0, 1, 2]
    assert sorted(backend.cancelled) == ["job-0", "job-1", "job-2"]
    _, failures = batchoutcomes.gather(s, store)
    assert str(failures[0]) == "job-0 broke" and str(failures[1]) == "job-1 broke"
    summary = failure_summary(s, failures)
    assert "inputs[0] (job-0): ValueError: job-0 broke" in summary
    assert "inputs[1] (job-1): ValueError: job-1 broke" in summary
    # A later poll (a sensor's retry) sees the same reports again: nothing to do.
    assert batchrun.observe(s, reports, backend, store) == []


def test_a_fail_fast_stop_cut_short_is_finished_by_the_next_poll(tmp_path, monkeypatch):
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(4, {0: "job-0", 1: "job-1", 2: "job-2"}, fail_fast=True)
    result(store, "job-0", False)
    running = StatusReport(JobStatus.RUNNING)
    reports = {"job-0": FAILED, "job-1": running, "job-2": running}
    real_cancel = backend.cancel

    def outage(h: JobHandle) -> None:
        if h.job_id == "job-2":
            raise OSError("cluster unavailable")
        real_cancel(h)

    monkeypatch.setattr(backend, "cancel", outage)
    with pytest.raises(OSError):
        batchrun.observe(s, reports, backend, store)
    # Nothing more launches, the uncancelled child is still active, not yet stopped.
    assert s.queue == [] and list(s.active) == [2] and not s.stopped
    assert s.done == {0: "FAILED", 1: "CANCELLED", 3: "NOT_SUBMITTED"}
    monkeypatch.undo()
    assert batchrun.observe(s, reports, backend, store) == []
    assert s.stopped and batchrun.is_finished(s) and s.done[2] == "CANCELLED"


@pytest.mark.parametrize("ordered", [True, False])
def test_gather_order_and_failures(tmp_path, ordered):
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(3, {0: "job-0", 1: "job-1", 2: "job-2"})
    for job, ok, value in (("job-0", True, "zero"), ("job-1", False, None), ("job-2", True, "two")):
        result(store, job, ok, value)
    ok = StatusReport(JobStatus.SUCCEEDED)
    batchrun.observe(s, {"job-2": ok}, backend, store)
    batchrun.observe(s, {"job-0": ok, "job-1": FAILED}, backend, store)
    values, failures = batchoutcomes.gather(s, store, ordered=ordered)
    assert list(failures) == [1] and str(failures[1]) == "job-1 broke"
    expected = ["zero", failures[1], "two"] if ordered else ["two", "zero", failures[1]]
    assert values == expected
    described = batchoutcomes.describe_exception(failures[1])
    assert described["type"] == "ValueError" and described["traceback"].endswith("tb")


def test_a_child_without_capacity_moves_to_the_next_step_apart_from_retries(tmp_path):
    from airflow_provider_kinetic.core.jobs.checkpoint import STARTED_NAME
    from airflow_provider_kinetic.core.spec.handles import REASON_NO_CAPACITY

    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(2, {0: "job-r0", 1: "job-r1"}, retries=0)
    s.template.options = s.template.options.but(capacity=["reservation:r1", "spot"])
    s.active = {i: handle(f"job-r{i}", capacity="reservation:r1") for i in (0, 1)}
    no_capacity = StatusReport(JobStatus.FAILED, REASON_NO_CAPACITY, "nothing started")
    # Child 1's runner did start (its start record is there): it must not run again.
    store.write_bytes(f"job-r1/{STARTED_NAME}", b"{}")
    assert batchrun.observe(s, {"job-r0": no_capacity, "job-r1": no_capacity}, backend, store) == [
        1
    ]
    assert s.queue[0] == 0 and s.steps == {0: 1} and s.attempts[0] == 0  # not a retry
    assert s.done == {1: "FAILED"}
    # The next job of input 0 is made for spot; the counts say which kinds ended children.
    s.active[0], s.attempts[0] = handle("job-s0", capacity="spot"), 1
    result(store, "job-s0", True, 5)
    assert batchrun.observe(s, {"job-s0": StatusReport(JobStatus.SUCCEEDED)}, backend, store) == [0]
    assert batchrun.counts(s)["capacity"] == {"spot": 1, "reservation": 1}


class Creating(LocalBackend):
    """Records the jobs it is asked to create; every job it knows of runs."""

    def __init__(self, running: set[str] | None = None) -> None:
        super().__init__("/nonexistent")
        self.created: list[str] = []
        self.running = set(running or ())

    def submit(self, spec: Any) -> None:
        self.created.append(spec.job_id)
        self.running.add(spec.job_id)

    def status(self, handle: JobHandle, listings: Any = None) -> StatusReport:
        if handle.job_id in self.running:
            return StatusReport(JobStatus.RUNNING)
        return StatusReport(JobStatus.NOT_FOUND, "no such job")


def _lost(tmp_path) -> tuple[LocalStore, KineticConfig, Any]:
    """A batch of 3 whose inputs 0 and 1 succeeded and whose input 2 the state lost:
    taken off the queue, never active nor done (as a save beside a launch kept it)."""
    config = KineticConfig(backend="local", root=str(tmp_path))
    store = config.store()
    s = state(3, {})
    s.queue, s.done, s.order = [], {0: "SUCCEEDED", 1: "SUCCEEDED"}, [0, 1]
    s.jobs = {
        0: batchlaunch.child_job_id(s.group_id, 0, 1),
        1: batchlaunch.child_job_id(s.group_id, 1, 1),
    }
    s.launches = {0: 1, 1: 1, 2: 1}
    return store, config, s


def test_a_lost_input_whose_child_was_created_is_adopted_not_made_again(tmp_path, caplog):
    store, config, s = _lost(tmp_path)
    job = batchlaunch.child_job_id(s.group_id, 2, 1)
    store.write_bytes(f"{job}/handle.json", b"{}")  # written before its create
    backend = Creating(running={job})
    assert batchlaunch.unaccounted(s) == [2]
    assert batchlaunch.launch(s, config, backend, store) == 1
    assert backend.created == [] and s.active[2].job_id == job and s.jobs[2] == job
    assert s.launches[2] == 1 and s.attempts[2] == 1 and batchlaunch.unaccounted(s) == []
    assert (
        "kinetic bug" in caplog.text and f"{job} (created, not recorded) is adopted" in caplog.text
    )


def test_a_lost_input_never_created_is_launched_once(tmp_path, caplog):
    store, config, s = _lost(tmp_path)
    backend = Creating()
    assert batchlaunch.launch(s, config, backend, store) == 1
    job = batchlaunch.child_job_id(s.group_id, 2, 1)
    assert backend.created == [job] and s.active[2].job_id == job and s.launches[2] == 1
    assert batchlaunch.launch(s, config, backend, store) == 0  # running now: never a second job
    assert backend.created == [job]
    assert "inputs[2] (neither queued, running nor done); it is launched now" in caplog.text


def test_a_lost_input_whose_recorded_child_ended_is_launched_anew(tmp_path):
    """The newest child the state records for the input is its last ended one: the
    lost launch never created its job, so the next id is made, once."""
    store, config, s = _lost(tmp_path)
    first = batchlaunch.child_job_id(s.group_id, 2, 1)
    store.write_bytes(f"{first}/handle.json", b"{}")
    s.jobs[2] = first  # failed once and was to be retried
    backend = Creating()
    batchlaunch.launch(s, config, backend, store)
    assert backend.created == [batchlaunch.child_job_id(s.group_id, 2, 2)] and s.launches[2] == 2


def test_an_input_that_never_ran_without_fail_fast_is_reported_as_our_bug(tmp_path, caplog):
    store, _, s = _lost(tmp_path)
    for i in (0, 1):
        result(store, s.jobs[i], True, i)
    values, failures = batchoutcomes.gather(s, store)
    assert values[:2] == [0, 1] and list(failures) == [2]
    exc = failures[2]
    assert isinstance(exc, KineticInternalError) and "fail_fast" not in str(exc).split(";")[0]
    assert "inputs[2] never ran (no outcome; fail_fast is off)" in str(exc)
    assert "a bug in airflow-provider-kinetic, not an error of your function" in str(exc)
    assert [r.levelname for r in caplog.records if "inputs[2] never ran" in r.message] == ["ERROR"]
    # Not submitted or cancelled although fail_fast never stopped the batch: ours too.
    s.done[2] = "NOT_SUBMITTED"
    s.fail_fast = True
    _, failures = batchoutcomes.gather(s, store)
    assert isinstance(failures[2], KineticInternalError)
    assert "(not submitted; fail_fast did not stop the batch)" in str(failures[2])


def test_inputs_fail_fast_stopped_read_fail_fast_and_are_no_bug(tmp_path, caplog):
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(3, {0: "job-0", 1: "job-1"}, fail_fast=True)
    result(store, "job-1", False)
    running = StatusReport(JobStatus.RUNNING)
    batchrun.observe(s, {"job-0": running, "job-1": FAILED}, backend, store)
    _, failures = batchoutcomes.gather(s, store)
    assert str(failures[0]) == "cancelled (fail_fast)"
    assert str(failures[2]) == "not submitted (fail_fast)"
    assert not any(isinstance(e, KineticInternalError) for e in failures.values())
    assert "never ran" not in caplog.text


def test_an_error_midway_leaves_the_input_queued_or_active_never_neither(tmp_path, monkeypatch):
    """An input leaves the queue only as it becomes active, and ``active`` only for
    ``done`` or the queue: an error on the way (a store outage, say) leaves it where it
    was, for the next poll, never lost to the batch."""
    store, config, s = _lost(tmp_path)
    s.queue, s.launches = [2], {0: 1, 1: 1}

    def outage(*_args: Any, **_kw: Any) -> Any:
        raise OSError("store unavailable")

    monkeypatch.setattr(batchlaunch, "child_spec", outage)
    with pytest.raises(OSError):
        batchlaunch.launch(s, config, Creating(), store)
    assert s.queue == [2] and 2 not in s.launches and batchlaunch.unaccounted(s) == []
    monkeypatch.undo()

    s.queue, s.active = [], {2: handle("job-x")}
    backend = Recorder()
    monkeypatch.setattr(backend, "cancel", outage)
    with pytest.raises(OSError):
        batchrun.observe(s, {"job-x": StatusReport(JobStatus.SUCCEEDED)}, backend, store)
    assert list(s.active) == [2] and 2 not in s.done and batchlaunch.unaccounted(s) == []


def test_input_retries_per_class_resubmit_each_input_by_its_failure(tmp_path):
    """A batch with mixed failures: each input gets the re-submits its failure's class
    has left (``input_retries`` in retry_on's form), a user error none."""
    store, backend = LocalStore(str(tmp_path)), Recorder()
    s = state(4, {0: "job-u", 1: "job-p", 2: "job-e", 3: "job-x"}, retries=0)
    s.retry_on = {"user_error": 0, "infra": 1, "preemption": 1, "exit_codes": [42]}
    result(store, "job-u", False)  # the function raised
    exited = make_result(
        success=False, exception=RuntimeError("sys.exit(42)"), traceback="tb", exit_code=42
    )
    store.write_bytes("job-x/result.pkl", dump_result(exited)[0])
    reports = {
        "job-u": FAILED,
        "job-p": StatusReport(JobStatus.FAILED, REASON_PREEMPTED, "the spot VM was reclaimed"),
        "job-e": StatusReport(JobStatus.FAILED, "Evicted", "The node was low on memory."),
        "job-x": FAILED,
    }
    assert batchrun.observe(s, reports, backend, store) == [0]
    assert s.done == {0: "FAILED"} and sorted(s.queue) == [1, 2, 3]
    assert s.failed_why[0] == "failed in phase execute (user_error): ValueError: job-u broke"
    assert s.resubmits == {1: {"preemption": 1}, 2: {"infra": 1}, 3: {"infra": 1}}
    assert s.preemptions == {1: 1}
    # Each budget is per input: the second infra failure of input 2 is its last.
    s.queue.remove(2)
    s.active[2] = handle("job-e2")
    assert batchrun.observe(s, {"job-e2": reports["job-e"]}, backend, store) == [2]
    assert s.done[2] == "FAILED" and s.failed_why[2].startswith("failed (infra): ")
    # The state carries its policy and counts across deferrals.
    again = type(s).from_dict(s.to_dict())
    assert again.retry_on == s.retry_on and again.resubmits == s.resubmits
