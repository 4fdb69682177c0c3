"""A deferred task ends in its trigger when its job succeeds and nothing must run on a
worker after it.

A trigger's event that resumes the task on a worker is held (``triggers.settle``): the
deferring worker's exit may be reported after the event, and Airflow fails a task
instance that is scheduled, queued or running again by then (apache/airflow#66374).  A
trigger can end its task itself instead: a ``TaskSuccessEvent`` sets the task
instance's state to success (``models/trigger.py``, on 3.1 and 3.3); the late exit
report then meets a finished task instance, which the scheduler leaves alone
(``_process_executor_events`` acts on scheduled, queued, running and restarting ones
only).  Such an event needs no hold, and the task ends with its job.  The XComs go
first, through the Task SDK as a worker pushes them (``XCom.set``: the deployment's XCom
class serializes them, the triggerer sends them): the event's own ``xcoms`` are stored
by the API server as JSON text, which a downstream task reads back as a string.

The operator decides at deferral whether anything must run on a worker afterwards
(:class:`EndTask`, made by ``operators.end_task``: no asset events, output key, cache
entry, lineage or multiple outputs, the deployment's default XCom backend); the trigger
decides at the job's end: it succeeded, its value is JSON as XCom holds it and at most
:data:`MAX_XCOM_BYTES`, the task's record still names this job for this try, and the
trigger does not run in the deferring process (``dag.test()`` resumes the task with the
event's payload, so there the worker finishes it).  Otherwise the event resumes the
task on a worker as before.

The finish is the worker's (``core.jobs.finish``), in its order:

1. the result is read and verified;
2. delivered: the XComs pushed, then the task's record says delivered and returned,
   and holds the XComs (``TaskRecord.xcoms``) until the task has ended;
3. to 6. history, the cleanup policy, the Job deleted, the task's checkpoints;
7. the usage line and metrics (``deployment.usage``), then the event.

A trigger of the same try re-created after its event was lost (a triggerer that died
in between) finds the record and hands the same value again: never a second run (the
usage XCom is not repeated: its line was logged and its metrics sent the first time).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from airflow_provider_kinetic.core.jobs.cleanup import POLICIES
from airflow_provider_kinetic.core.jobs.finish import finish_job
from airflow_provider_kinetic.core.jobs.taskrecord import TaskRecord, read_record, write_record
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore

#: The largest value a trigger hands Airflow itself (JSON bytes): the task's record
#: holds it until Airflow has it, and every try reads that record.  A larger value
#: goes through a worker (which may make it a reference).
MAX_XCOM_BYTES = 64 * 1024
#: XCom keys as Airflow names them.
RETURN_VALUE = "return_value"
USAGE = "kinetic_usage"


class NotHere(Exception):
    """The worker finishes this task after all (the reason is the message); nothing of
    the job was changed."""


@dataclass(frozen=True)
class EndTask:
    """What a trigger needs to end its task itself (the operator's ``cleanup`` policy,
    the task's identity as its try recorded it, whether the value is pushed as
    ``return_value``), as trigger kwargs (JSON).  ``collect=False``: a task that takes
    no value from the job (``KineticJobSensor`` without ``return_result``): the job is
    finished without reading its result, and the task has no record to hold one."""

    cleanup: str
    identity: dict[str, Any] = field(default_factory=dict)
    push_value: bool = True
    collect: bool = True
    #: A map task's: its values in input order (else completion order).
    ordered: bool = True

    def __post_init__(self) -> None:
        if self.cleanup not in POLICIES:
            raise ValueError(f"cleanup={self.cleanup!r}: one of {', '.join(POLICIES)}")
        missing = [k for k in ("dag_id", "run_id", "task_id") if not self.identity.get(k)]
        if missing:
            raise ValueError(f"the task's identity lacks {', '.join(missing)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndTask:
        """From trigger kwargs; fields a later version adds are left out."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def json_native(value: Any) -> bool:
    """Whether ``value`` is JSON as it stands (so XCom returns it unchanged): dicts with
    string keys, lists, strings, finite numbers, booleans and None; a tuple is not
    (a worker's XCom keeps it a tuple)."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(json_native(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_native(v) for k, v in value.items())
    return False


def value_xcoms(value: Any, push_value: bool) -> dict[str, Any]:
    """The XComs that hand Airflow ``value``; ``NotHere`` when it does not fit."""
    if not push_value:
        return {}
    if not json_native(value):
        raise NotHere(f"its value is a {type(value).__name__}, not plain JSON")
    size = len(json.dumps(value))
    if size > MAX_XCOM_BYTES:
        raise NotHere(f"its value is {size:,} bytes of JSON (over {MAX_XCOM_BYTES:,})")
    return {RETURN_VALUE: value}


def push_xcoms(identity: dict[str, Any], xcoms: dict[str, Any]) -> None:
    """Hand Airflow the task's XComs as its worker would (the Task SDK's ``XCom.set``:
    the deployment's XCom class, sent by the triggerer).  Call it in a thread made by
    ``asgiref.sync.sync_to_async``: the triggerer's channel answers there on 3.1 and 3.3."""
    from airflow.sdk.execution_time.xcom import XCom

    for key, value in xcoms.items():
        XCom.set(
            key,
            value,
            dag_id=identity["dag_id"],
            task_id=identity["task_id"],
            run_id=identity["run_id"],
            map_index=int(identity.get("map_index", -1)),
        )


def warm_channel(identity: dict[str, Any]) -> None:
    """One cheap read through the Task SDK (this task's own ``return_value``, which its
    try has not pushed), made as the trigger starts: the first call through a fresh
    triggerer's channel took 5.2 s (measured under ``airflow standalone``; 2 ms after
    it), so it is paid while the job runs, not after it ends.  Never fails."""
    from airflow.sdk.execution_time.xcom import XCom

    try:
        XCom.get_one(
            key=RETURN_VALUE,
            dag_id=identity["dag_id"],
            task_id=identity["task_id"],
            run_id=identity["run_id"],
            map_index=int(identity.get("map_index", -1)),
        )
    except Exception:  # noqa: BLE001 - a warm-up: the finish makes its own calls
        return


def handed_before(
    store: ObjectStore, secret: Any, work: JobHandle | str, end: EndTask
) -> dict[str, Any] | None:
    """The XComs this try's trigger already ended the task with (its event was lost),
    pushed again; or None.  ``work``: the job's handle, or a batch's group id."""
    record = read_record(store, end.identity, secret)
    if record is None or record.xcoms is None or not ours(record, work, end):
        return None
    push_xcoms(end.identity, record.xcoms)
    return dict(record.xcoms)


def ours(record: TaskRecord, work: JobHandle | str, end: EndTask) -> bool:
    """Whether the task's record names ``work`` (a job's handle, or a batch's group
    id) for the try that deferred."""
    if record.try_number != end.identity.get("try_number"):
        return False
    if isinstance(work, str):
        return record.kind == "batch" and record.group_id == work
    job = record.job
    return job is not None and job.job_id == work.job_id


def finish_here(
    store: ObjectStore,
    backend: Any,
    secret: Any,
    handle: JobHandle,
    report: StatusReport,
    end: EndTask,
    result_key: str | None,
    log: Any,
) -> dict[str, Any]:
    """Finish the succeeded job as a worker would (see the module) and return the XComs
    to end the task with; ``NotHere`` (nothing changed) when the worker must."""
    from airflow_provider_kinetic.deployment.usage import account

    if not end.collect:  # nothing read, nothing to hold: the finish alone
        log.info("kinetic job %s finished: %s", handle.job_id, report.describe())
        finish_job(
            store,
            backend,
            handle,
            report,
            cleanup=end.cleanup,
            result_key=None,
            read_value=False,
            log_=log,
        )
        return {}
    record = read_record(store, end.identity, secret)
    if record is None or not ours(record, handle, end) or record.returned:
        raise NotHere("the task's record names another job or try")
    xcoms: dict[str, Any] = {}

    def deliver(value: Any, blob: bytes) -> Any:
        xcoms.update(value_xcoms(value, end.push_value))
        push_xcoms(end.identity, xcoms)  # Airflow has the value before anything goes
        ended = replace(record, delivered=True, returned=True, xcoms=dict(xcoms))
        write_record(store, end.identity, ended, secret)  # its holder until the task ends
        return value

    log.info("kinetic job %s finished: %s", handle.job_id, report.describe())
    done = finish_job(
        store,
        backend,
        handle,
        report,
        cleanup=end.cleanup,
        result_key=result_key,
        deliver=deliver,
        checkpoints_of=end.identity,
        log_=log,
    )
    if done.error is not None:  # unreadable after all: the worker raises it its own way
        raise NotHere(f"its result could not be read: {done.failure}")
    usage = account(store, record.attempts or [handle.job_id], record.try_number, log)
    if usage is not None and json_native(usage):
        try:
            push_xcoms(end.identity, {USAGE: usage})
            xcoms[USAGE] = usage
        except Exception as exc:  # noqa: BLE001 - an account, never the task's outcome
            log.warning("kinetic usage could not be pushed: %s", exc)
    return xcoms
