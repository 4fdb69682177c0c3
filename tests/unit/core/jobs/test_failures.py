"""Every failure has a class and a phase (``core.spec.failure``, ``core.jobs.classify``),
raises the typed exception of its class (``exceptions.py``), and ``retry_on`` takes
only its allowed forms, refusing others when the operator is made (DAG parse time)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_kinetic import (
    KineticInfraError,
    KineticJobCancelled,
    KineticJobFailed,
    KineticMapOperator,
    KineticNoCapacity,
    KineticPreempted,
    KineticRunOperator,
    KineticStoreError,
    KineticTimeout,
    KineticUserError,
)
from airflow_provider_kinetic.core.backends.k8s import status as ks
from airflow_provider_kinetic.core.jobs.classify import classify, exit_code_of
from airflow_provider_kinetic.core.jobs.finish import failure_of, finish_job
from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.jobs.retry_on import BadRetryOn, RetryOn, parse_retry_on
from airflow_provider_kinetic.core.jobs.signing import ResultAuthError
from airflow_provider_kinetic.core.spec.failure import PHASES, Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import (
    REASON_EVICTED,
    REASON_NO_CAPACITY,
    REASON_PREEMPTED,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.exceptions import ERROR_FOR_CLASS, job_failed
from tests.fixtures import records
from tests.fixtures.ended_jobs import EndedBackend

FAILED = JobStatus.FAILED


def failed_in(phase: str, exc: BaseException, **kw: Any) -> dict[str, Any]:
    return make_result(success=False, exception=exc, traceback="tb", phase=phase, **kw)


@pytest.mark.parametrize(
    ("phase", "exc", "kind"),
    [
        ("execute", ValueError("bad"), FailureClass.USER_ERROR),
        ("result serialization", TypeError("cannot pickle"), FailureClass.USER_ERROR),
        ("execute", MemoryError(), FailureClass.INFRA),  # a memory limit: the environment's
        ("requirements install", RuntimeError("pip failed"), FailureClass.INFRA),
        ("data resolve", FileNotFoundError("gone"), FailureClass.INFRA),
        ("artifact download", OSError("503"), FailureClass.INFRA),
        ("store result", OSError("quota"), FailureClass.STORE),
    ],
)
def test_a_failure_payload_decides_class_and_phase(phase, exc, kind):
    report = StatusReport(FAILED, "exit code 1")
    failure = classify("job-1", report, failed_in(phase, exc))
    assert (failure.failure_class, failure.phase, failure.exit_code) == (kind, phase, 1)
    assert failure.exception_type == f"builtins.{type(exc).__name__}"
    assert failure.job_id == "job-1" and failure.traceback == "tb"


@pytest.mark.parametrize(
    ("reason", "message", "kind", "phase", "code"),
    [
        ("killed by SIGKILL", "", FailureClass.INFRA, None, 137),
        ("exit code 3", "", FailureClass.INFRA, None, 3),
        ("never started: ModuleNotFoundError: x", "", FailureClass.INFRA, "startup", None),
        ("cancelled", "", FailureClass.CANCELLED, None, None),
        (ks.REASON_IMAGE_PULL_BACKOFF, "container kinetic-worker: back-off", FailureClass.INFRA,
         "startup", None),
        (ks.REASON_OOM_KILLED, "ran out of memory (exit code 137)", FailureClass.INFRA, None, 137),
        (REASON_PREEMPTED, "the spot VM was reclaimed", FailureClass.PREEMPTION, None, None),
        (REASON_EVICTED, "The node was low on resource: memory.", FailureClass.INFRA, None, None),
        (ks.REASON_NODE_LOST, "node n1 unreachable", FailureClass.INFRA, None, None),
        (ks.REASON_UNSCHEDULABLE, "0/3 nodes", FailureClass.NO_CAPACITY, "startup", None),
        (REASON_NO_CAPACITY, "spot: 15m", FailureClass.NO_CAPACITY, "startup", None),
        (ks.REASON_JOB_FAILED, "DeadlineExceeded: Job was active longer", FailureClass.TIMEOUT,
         None, None),
        (ks.REASON_NONZERO_EXIT, "container kinetic-worker exited with code 2", FailureClass.INFRA,
         None, 2),
    ],
)  # fmt: skip
def test_without_a_payload_the_platform_reason_decides(reason, message, kind, phase, code):
    failure = classify("job-2", StatusReport(FAILED, reason, message))
    assert (failure.failure_class, failure.phase, failure.exit_code) == (kind, phase, code)
    assert failure.reason == reason


def test_a_succeeded_job_whose_result_cannot_be_read_failed_in_the_store():
    failure = classify("job-3", StatusReport(JobStatus.SUCCEEDED), error=OSError("unreadable"))
    assert failure.failure_class is FailureClass.STORE and "unreadable" in failure.message


def test_a_payload_that_fails_its_signature_is_the_stores_never_a_resubmit():
    unsigned = ResultAuthError("result payload of job job-9 has no signature")
    failure = classify("job-9", StatusReport(FAILED, "exit code 1"), error=unsigned)
    assert failure.failure_class is FailureClass.STORE
    assert parse_retry_on({"infra": 5}).budget(failure.failure_class) == 0


def test_a_cancel_request_wins_over_the_platform_reason():
    failure = classify("job-4", StatusReport(FAILED, "killed by SIGTERM"), cancelled=True)
    assert failure.failure_class is FailureClass.CANCELLED


def test_exit_codes_that_count_as_infra():
    exited = failed_in("execute", RuntimeError("function called sys.exit(42)"), exit_code=42)
    report = StatusReport(FAILED, "exit code 1")
    assert classify("j", report, exited).failure_class is FailureClass.USER_ERROR
    failure = classify("j", report, exited, infra_exit_codes={42})
    assert (failure.failure_class, failure.exit_code) == (FailureClass.INFRA, 42)
    # A preemption stays one whatever its code.
    preempted = StatusReport(FAILED, REASON_PREEMPTED, "exit code 143")
    assert classify("j", preempted, infra_exit_codes={143}).failure_class is (
        FailureClass.PREEMPTION
    )


def test_exit_codes_are_read_from_signals_and_messages():
    assert exit_code_of("killed by SIGTERM") == 143
    assert exit_code_of("container x exited with code 7 (Error)") == 7
    assert exit_code_of("nothing here") is None and exit_code_of(None) is None


def test_the_lowest_failing_host_is_named_with_the_others():
    worker = failed_in("data resolve", FileNotFoundError("/data/x"), host_index=2)
    failure = classify(
        "job-5", StatusReport(FAILED, ks.REASON_WORKER_FAILED), worker,
        failed_hosts=[3, 2], host_count=4,
    )  # fmt: skip
    assert (failure.host_index, failure.other_hosts) == (2, (3,))
    assert failure.describe() == (
        "failed in phase data resolve (infra) on host 2 of 4 (hosts 3 failed too): "
        "FileNotFoundError: /data/x"
    )


def test_a_user_error_in_slice_1_names_slice_1():
    """A multi-slice job's runner adds its layout to the payload (runner/invocation.py):
    job-wide host 2 of 2 slices x 2 hosts is slice 1 host 0."""
    payload = {**failed_in("execute", ValueError("bad shard"), host_index=2)}
    payload.update(num_slices=2, slice_hosts=2)
    failure = classify("job-6", StatusReport(FAILED, ks.REASON_NONZERO_EXIT), payload)
    assert failure.failure_class is FailureClass.USER_ERROR
    assert (failure.host_index, failure.host_count, failure.slice_hosts) == (2, 4, 2)
    assert failure.describe() == (
        "failed in phase execute (user_error) on slice 1 host 0 (2 slices of 2 hosts): "
        "ValueError: bad shard"
    )
    assert Failure.from_dict(failure.to_dict()).slice_hosts == 2  # history keeps the slice


def test_a_failure_travels_as_json_and_back():
    failure = Failure(
        FailureClass.USER_ERROR, phase="execute", job_id="job-6", exit_code=1, host_index=0,
        host_count=1, exception_type="builtins.ValueError", exception_message="bad",
        traceback="Traceback ...", other_hosts=(1,),
    )  # fmt: skip
    wire = failure.to_dict()
    assert wire["class"] == "user_error" and "traceback" not in wire  # the log holds it
    assert wire["other_hosts"] == [1]
    back = Failure.from_dict(wire)
    assert back == Failure(**{**failure.__dict__, "traceback": None})
    assert failure.describe() == (
        "failed in phase execute (user_error), exit code 1 (hosts 1 failed too): ValueError: bad"
    )


def test_phases_are_kinetics():
    assert PHASES[0] == "startup" and PHASES[-2:] == ("execute", "result serialization")
    assert "requirements install" in PHASES and "data resolve" in PHASES


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        (FailureClass.USER_ERROR, KineticUserError),
        (FailureClass.INFRA, KineticInfraError),
        (FailureClass.PREEMPTION, KineticPreempted),
        (FailureClass.NO_CAPACITY, KineticNoCapacity),
        (FailureClass.TIMEOUT, KineticTimeout),
        (FailureClass.CANCELLED, KineticJobCancelled),
        (FailureClass.STORE, KineticStoreError),
    ],
)
def test_each_class_raises_its_own_type(kind, error):
    failure = Failure(kind, phase="execute", job_id="job-7")
    exc = job_failed("kinetic job job-7 failed", failure)
    assert type(exc) is error and isinstance(exc, KineticJobFailed)
    assert (exc.failure, exc.failure_class, exc.phase, exc.job_id) == (
        failure,
        kind,
        "execute",
        "job-7",
    )
    assert set(ERROR_FOR_CLASS) == set(FailureClass)


def test_a_timeout_is_still_a_cancel_for_old_except_clauses():
    assert issubclass(KineticTimeout, KineticJobCancelled)
    assert type(job_failed("x", None, "job-8")) is KineticJobFailed


# ---- retry_on -------------------------------------------------------------------------


def test_retry_on_forms():
    assert parse_retry_on(None) == RetryOn({"preemption": 2})
    assert parse_retry_on(None, preemption_retries=5) == RetryOn({"preemption": 5})
    assert parse_retry_on({"infra": 1}).budget("infra") == 1
    assert parse_retry_on({"infra": 1}).budget("preemption") == 2  # its default stays
    policy = parse_retry_on({"exit_codes": [42, 143], "user_error": 0})
    assert policy.exit_codes == frozenset({42, 143}) and policy.budget("user_error") == 0
    never = parse_retry_on("never")
    assert never.never and all(never.budget(c) == 0 for c in FailureClass)
    # A rendered template: JSON, or the Python literal Jinja makes of a dict.
    assert parse_retry_on('{"infra": 2}').budget("infra") == 2
    assert parse_retry_on("{'infra': 3}").budget("infra") == 3


@pytest.mark.parametrize(
    ("value", "preemption_retries", "says"),
    [
        ({"oom": 1}, None, "unknown failure class 'oom'"),
        ({"timeout": 1}, None, "unknown failure class 'timeout'"),
        ({"infra": -1}, None, "non-negative int, got -1"),
        ({"infra": True}, None, "non-negative int, got True"),
        ({"never": True, "infra": 1}, None, '"never" cannot be combined'),
        ("never", 3, '"never" cannot be combined with preemption_retries=3'),
        ({"exit_codes": [300]}, None, "exit codes 0-255"),
        ({"preemption": 1}, 2, "disagree"),
        (["infra"], None, "allowed: a dict of re-submit counts"),
        ("sometimes", None, "got 'sometimes'"),
    ],
)
def test_bad_retry_on_fails_naming_the_allowed_forms(value, preemption_retries, says):
    with pytest.raises(BadRetryOn, match="allowed|disagree") as caught:
        parse_retry_on(value, preemption_retries=preemption_retries)
    assert says in str(caught.value)


def test_bad_retry_on_fails_when_the_dag_is_parsed():
    with pytest.raises(BadRetryOn, match="unknown failure class 'bug'"):
        KineticRunOperator(task_id="t", python_callable=len, retry_on={"bug": 1})
    with pytest.raises(ValueError, match="integer >= 0, got 'never!'; or per class, a dict"):
        KineticMapOperator(task_id="m", python_callable=len, inputs=[1], input_retries="never!")
    with pytest.raises(BadRetryOn, match="unknown failure class 'oom'"):
        KineticMapOperator(task_id="m", python_callable=len, inputs=[1], input_retries={"oom": 1})
    assert (
        KineticMapOperator(
            task_id="m", python_callable=len, inputs=[1], input_retries="never"
        ).input_retries
        == "never"
    )
    op = KineticRunOperator(task_id="t", python_callable=len, retry_on="{{ params.r }}")
    assert "retry_on" in op.template_fields and op.retry_on == "{{ params.r }}"


def test_a_multi_host_job_names_its_lowest_failing_host_and_the_others(tmp_path):
    """Workers 2 and 3 of a 4-host slice wrote their failures while the leader ran: the
    job's failure is host 2's, naming host 3 too (``core.jobs.finish.failure_of``)."""
    store = LocalStore(str(tmp_path))
    job = records.handle("job-mh", str(tmp_path), backend="pathways", accelerator="tpu-v6e-4x4")
    for host, exc in ((3, OSError("3 broke")), (2, FileNotFoundError("/data/x"))):
        blob, _ = dump_result(failed_in("data resolve", exc, host_index=host))
        store.write_bytes(f"job-mh/result-worker-{host}.pkl", blob)
    report = StatusReport(FAILED, ks.REASON_WORKER_FAILED, "worker pod x-0-2: exited with code 1")
    failure = failure_of(store, job, report, None)
    assert failure is not None
    assert (failure.host_index, failure.host_count, failure.other_hosts) == (2, 4, (3,))
    assert failure.describe() == (
        "failed in phase data resolve (infra) on host 2 of 4, exit code 1 "
        "(hosts 3 failed too): FileNotFoundError: /data/x"
    )


class Said:
    """A logger that keeps what it was told, formatted."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _say(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)

    info = warning = error = debug = _say


def test_the_failing_hosts_own_log_is_shown_before_its_pods_go(tmp_path):
    backend = EndedBackend(str(tmp_path))
    store = LocalStore(str(tmp_path))
    job = records.handle("job-h2", str(tmp_path), backend="pathways", accelerator="tpu-v6e-4x4")
    blob, _ = dump_result(failed_in("execute", ValueError("bad shard"), host_index=2))
    store.write_bytes("job-h2/result-worker-2.pkl", blob)
    backend.host_logs[2] = "loading shard 7\nhost 2: bad shard\n"
    report = StatusReport(FAILED, ks.REASON_WORKER_FAILED, "worker pod x-0-2: exit code 1")
    said = Said()
    done = finish_job(store, backend, job, report, cleanup="never", result_key=None, log_=said)
    assert done.classified is not None and done.classified.host_index == 2
    assert "[job-h2 host 2] host 2: bad shard" in said.lines
    events = [what for what, _ in backend.events]
    assert events.index("read_host_log") < events.index("cancel")  # read while it is there


def test_task_kinetic_takes_retry_on_as_a_template_and_refuses_a_bad_one():
    from airflow.sdk import DAG

    from airflow_provider_kinetic import kinetic_task

    def double(x: int) -> int:
        return 2 * x

    with DAG("kinetic_retry_on_decorator", schedule=None):
        out = kinetic_task(retry_on={"infra": 1, "exit_codes": [42]})(double)(2)
        with pytest.raises(BadRetryOn, match="unknown failure class 'bug'"):
            kinetic_task(retry_on={"bug": 1})(double)(3)
    op = out.operator
    assert "retry_on" in op.template_fields
    assert op.retry_on == {"infra": 1, "exit_codes": [42]}
