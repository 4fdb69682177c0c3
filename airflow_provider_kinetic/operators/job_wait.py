"""Waiting for a job in the worker: its status polled, its log shown live."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.k8s.status import REASON_NOT_ADMITTED
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.polling import StoreOutage, poll_delays
from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
from airflow_provider_kinetic.core.jobs.usage import note_admitted
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.connection import store_outage_window_s
from airflow_provider_kinetic.exceptions import KineticTimeout


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
    while True:
        try:
            report = backend.status(handle)
        except OSError as exc:  # the store cannot be read: no answer about the job
            delay = outage.failed(exc)  # re-raised once the window has passed
            log.warning("kinetic job %s: %s", handle.job_id, outage.describe(exc, delay))
            time.sleep(delay)
            continue
        outage.recovered()
        offset = show_logs(backend, handle, offset, log)
        if report.describe() != last:
            log.info("kinetic job %s: %s", handle.job_id, report.describe())
            if admitting and report.reason != REASON_NOT_ADMITTED:  # Kueue let it in
                note_admitted(store, handle.job_id, time.time())
            admitting = report.reason == REASON_NOT_ADMITTED
            last = report.describe()
            if report.status is JobStatus.RUNNING:
                history.update(store, handle.job_id, report.status.value, report.reason)
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


def show_logs(backend: Backend, handle: JobHandle, offset: int, log: Any) -> int:
    """The job's log from ``offset`` into the task log; the new offset."""
    text, new_offset = backend.read_logs(handle, offset)
    for line in text.splitlines():
        log.info("[%s] %s", handle.job_id, line)
    return new_offset
