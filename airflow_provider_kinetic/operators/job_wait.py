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
from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
from airflow_provider_kinetic.core.jobs.usage import note_admitted
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.connection import store_outage_window_s
from airflow_provider_kinetic.exceptions import KineticTimeout
from airflow_provider_kinetic.operators import reuse
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
