"""Waiting for a job in the worker, as functions of the try (``TaskTry``): its status
polled, its log shown live, and the job that takes over from an ended one (the next
capacity step's, or a preempted job's re-submit)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.k8s.status import REASON_NOT_ADMITTED
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.polling import StoreOutage, poll_delays
from airflow_provider_kinetic.core.jobs.progress import ProgressWatch
from airflow_provider_kinetic.core.jobs.taskrecord import DEFERRED, request_cancel
from airflow_provider_kinetic.core.jobs.usage import note_admitted
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.connection import store_outage_window_s
from airflow_provider_kinetic.exceptions import KineticJobCancelled, KineticTimeout
from airflow_provider_kinetic.operators import reuse
from airflow_provider_kinetic.operators.common import deadline as task_deadline
from airflow_provider_kinetic.operators.common import show_job_logs
from airflow_provider_kinetic.operators.takeover import takeover
from airflow_provider_kinetic.operators.task_try import TaskTry


@dataclass
class Watched:
    """Where a wait ended: on ``handle`` (a later capacity step's job, or a re-submit,
    when the first one was taken over), with its final ``report`` (None: the wait gave
    up and the task defers), its log shown up to ``offset``."""

    handle: JobHandle
    report: StatusReport | None
    offset: int
    #: Re-deferring (report None): the trigger's error count and the deadline it keeps.
    attempt: int = 0
    deadline: float | None = None


def poll_job(
    backend: Backend,
    store: ObjectStore,
    handle: JobHandle,
    *,
    poll_interval: float,
    log: Any,
    deadline: float | None,
    give_up_after: float | None = None,
) -> Watched:
    """Poll until the job ends (its report) or, with ``give_up_after`` (seconds), until
    then (report ``None``: the caller defers).  At ``deadline`` (epoch seconds: the
    task's execution_timeout) the job is cancelled."""
    give_up = None if give_up_after is None else time.monotonic() + give_up_after
    offset, last, admitting = 0, None, False
    delays = poll_delays(poll_interval, backend.first_poll_s)
    outage = StoreOutage(store_outage_window_s())
    watch = ProgressWatch(store, handle.job_id)  # what the function reports (a store read)
    while True:
        try:
            report = backend.status(handle)
        except OSError as exc:  # the store cannot be read: no answer about the job
            delay = outage.failed(exc)  # re-raised once the window has passed
            log.warning("kinetic job %s: %s", handle.job_id, outage.describe(exc, delay))
            time.sleep(delay)
            continue
        outage.recovered()
        offset = show_job_logs(backend, handle, offset, log)
        if report.describe() != last:
            log.info("kinetic job %s: %s", handle.job_id, report.describe())
            if admitting and report.reason != REASON_NOT_ADMITTED:  # Kueue let it in
                note_admitted(store, handle.job_id, time.time())
            admitting = report.reason == REASON_NOT_ADMITTED
            last = report.describe()
            if report.status is JobStatus.RUNNING:
                history.update(store, handle.job_id, report.status.value, report.reason)
        running = report.status is JobStatus.RUNNING or report.status.is_terminal
        if running and (line := watch.poll(report.status.is_terminal)) is not None:
            log.info("kinetic job %s: %s", handle.job_id, line)
        if report.status.is_terminal:
            return Watched(handle, report, offset)
        if give_up is not None and time.monotonic() >= give_up:
            return Watched(handle, None, offset)
        if deadline is not None and time.time() >= deadline:
            request_cancel(store, backend, handle)
            failure = Failure(
                FailureClass.TIMEOUT,
                job_id=handle.job_id,
                message="cancelled at the task's execution_timeout",
            )
            log.error("kinetic job %s %s", handle.job_id, failure.describe())
            raise KineticTimeout(
                f"kinetic job {handle.job_id} cancelled at the task's execution_timeout",
                failure=failure,
            )
        delay = next(delays)
        if give_up is not None:
            delay = max(0.0, min(delay, give_up - time.monotonic()))
        backend.wait([handle], delay)


def event_report(event: dict[str, Any]) -> StatusReport | None:
    """The job's final report as the trigger's event carries it, or ``None`` when the
    event is no final answer: ``timeout`` or ``error`` (the job may still run), or
    ``NOT_FOUND`` (the job was not seen: read once more before the task acts on it).

    A job that succeeded or failed stays so, so the resumed task does not read its
    status again (on GKE that read is a Job read and a pod list)."""
    try:
        status = JobStatus(event.get("status"))
    except ValueError:
        return None
    if status not in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        return None
    return StatusReport(status, event.get("reason"), str(event.get("message") or ""))


def wait(
    t: TaskTry, handle: JobHandle, deadline: float | None, give_up_after: float | None = None
) -> Watched:
    """Poll until the job ends and no job takes over from it (``next_job``), or,
    with ``give_up_after`` (seconds, from each job's start of the wait), until then."""
    while True:
        watched = poll_job(
            t.backend,
            t.store,
            handle,
            poll_interval=t.op.poll_interval,
            log=t.log,
            deadline=deadline,
            give_up_after=give_up_after,
        )
        if watched.report is None:
            return watched
        new = next_job(t, handle, watched.report)
        if new is None:
            return watched
        handle = new


def next_job(t: TaskTry, handle: JobHandle, report: StatusReport) -> JobHandle | None:
    """The job that takes over from ``handle``, which ended with ``report``
    (``operators.takeover``): the next capacity step's, or a preempted job's
    re-submit; None: finish this one."""
    then = takeover(t.op, t.config, t.store, t.record, handle, report, t.log)
    if then is None:
        return None
    if then.preempted:
        failure = then.failure
        preempted = failure is None or failure.failure_class is FailureClass.PREEMPTION
        state = "PREEMPTED" if preempted else report.status.value
        why = report.reason if failure is None else failure.describe()
        extra = {"failure": failure.to_dict()} if failure is not None else {}
        history.update(t.store, handle.job_id, state, why, **extra)
        t.retire(handle, archive_logs=True)
        t.backend.cancel(handle)  # delete what is left of it
        new = t.submit()
    else:
        why = f"{report.reason}: {report.message}"
        history.update(t.store, handle.job_id, history.CANCELLED, why)
        t.backend.cancel(handle)  # delete the Job that never ran (its pods never started)
        t.retire(handle)
        new = t.submit(t.plan(then.step))
    reuse.name_job(t, new)
    t.write_record(new, preemptions=then.preemptions, resubmits=then.resubmits)
    t.publish(new)
    return new


def resumed(t: TaskTry, event: dict[str, Any], max_redefer: int) -> Watched:
    """Back from the trigger: what the try does next.  A final report: finish it (or
    defer on the job that takes over: ``next_job``); no report: defer again (a
    trigger *error* while the job runs, up to ``max_redefer`` times; an event of
    another try's job).  A timeout, or errors beyond that, cancel the job and raise.

    The event is this try's only when it names the job the try's record names: on
    Airflow with SQLite, a cleared try's trigger row is deleted and its id given to
    the next try's new trigger, and a triggerer that has not yet stopped the old
    trigger keeps it running under that id: the old job's end then resumes the new
    try (seen under ``airflow standalone`` on 3.1).  Such an event is set aside: the
    try waits for its own job."""
    handle = JobHandle.from_dict(event["handle"])
    offset = int(event.get("log_offset") or 0)  # the trigger showed the log up to here
    own = own_job_instead(t, handle)
    if own is not None:
        t.log.warning(
            "kinetic: the trigger's event is job %s's, not this try's job %s (an earlier "
            "try's trigger, still running after a clear); waiting for job %s",
            handle.job_id,
            own.job_id,
            own.job_id,
        )
        t.handle = own
        report = t.backend.status(own)
        ours = {"deadline": task_deadline(t.context, t.op.execution_timeout)}
        if not report.status.is_terminal:
            return Watched(own, None, 0, deadline=ours["deadline"])
        handle, offset, event = own, 0, {**ours, "status": report.status.value}
    else:
        t.handle = handle
        report = event_report(event)
        if report is None:  # no final answer from the trigger: ask the job itself
            report = t.backend.status(handle)
    t.log.info(
        "kinetic job %s resumed: trigger said %s, job is %s",
        handle.job_id,
        event.get("status"),
        report.describe(),
    )
    if report.status.is_terminal:
        new = next_job(t, handle, report)
        if new is not None:
            return Watched(new, None, 0, deadline=event.get("deadline"))
        return Watched(handle, report, offset)
    attempt = int(event.get("attempt") or 0) + 1
    if event.get("status") == "error" and attempt <= max_redefer:
        t.log.warning(
            "trigger error (%s); waiting again (%d/%d)", event.get("message"), attempt, max_redefer
        )
        return Watched(handle, None, offset, attempt, event.get("deadline"))
    why = event.get("message") or event.get("status")
    request_cancel(t.store, t.backend, handle)
    t.show_logs(handle, offset)
    raise KineticJobCancelled(
        f"kinetic job {handle.job_id} cancelled: trigger ended with "
        f"{event.get('status')} ({why}) while the job was {report.status.value}",
        job_id=handle.job_id,
    )


def own_job_instead(t: TaskTry, handle: JobHandle) -> JobHandle | None:
    """The job this try's record names when an event names another one (``resumed``):
    the record says this try deferred on that job and has not delivered it.  None when
    the event is the try's own, or the record says nothing of this try's wait."""
    record = t.record
    if record is None or record.try_number != t.identity.get("try_number"):
        return None
    if record.mode != DEFERRED or record.delivered:
        return None
    own = record.job
    return own if own is not None and own.job_id != handle.job_id else None
