"""KineticRunOperator's synchronous wait: poll the job, show its log live, finish.

``_finish`` (collect the value or the remote error, delete the job, mark the record
delivered, clean up artifacts) and ``_show_logs`` are also how the deferred path
(``run_deferred``) ends, which is why that path builds on ``RunSyncWait``.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.k8s.status import REASON_NOT_ADMITTED
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import remove_checkpoints
from airflow_provider_kinetic.core.jobs.cleanup import after_job, deletes
from airflow_provider_kinetic.core.jobs.polling import StoreOutage, poll_delays
from airflow_provider_kinetic.core.jobs.results import collect_with_blob
from airflow_provider_kinetic.core.jobs.taskrecord import (
    cancel_requested,
    read_record,
    request_cancel,
)
from airflow_provider_kinetic.core.jobs.usage import note_admitted
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.connection import store_outage_window_s
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.exceptions import KineticJobCancelled, KineticJobFailed
from airflow_provider_kinetic.operators.common import (
    describe_failure,
    push_value,
    result_ref_uris,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.operators.run_tries import RunTriesBase
from airflow_provider_kinetic.operators.usage import report_usage


class RunSyncWait(RunTriesBase):
    """Waiting for a job in the worker, and collecting it (see KineticRunOperator)."""

    def _wait(
        self,
        backend: Backend,
        handle: JobHandle,
        deadline: float | None,
        give_up: float | None = None,
    ) -> tuple[StatusReport | None, int]:
        """Poll until the job ends (its report) or, with ``give_up`` (a monotonic
        time), until then (``None``: the caller defers); the log offset shown so far."""
        offset, last, admitting = 0, None, False
        delays = poll_delays(self.poll_interval, backend.first_poll_s)
        outage = StoreOutage(store_outage_window_s())
        while True:
            try:
                report = backend.status(handle)
            except OSError as exc:  # the store cannot be read: no answer about the job
                delay = outage.failed(exc)  # re-raised once the window has passed
                self.log.warning("kinetic job %s: %s", handle.job_id, outage.describe(exc, delay))
                time.sleep(delay)
                continue
            outage.recovered()
            offset = self._show_logs(backend, handle, offset)
            if report.describe() != last:
                self.log.info("kinetic job %s: %s", handle.job_id, report.describe())
                if admitting and report.reason != REASON_NOT_ADMITTED:  # Kueue let it in
                    note_admitted(self._store, handle.job_id, time.time())
                admitting = report.reason == REASON_NOT_ADMITTED
                last = report.describe()
                if report.status is JobStatus.RUNNING:
                    history.update(self._store, handle.job_id, report.status.value, report.reason)
            if report.status.is_terminal:
                return report, offset
            if give_up is not None and time.monotonic() >= give_up:
                return None, offset
            if deadline is not None and time.time() >= deadline:
                request_cancel(self._store, backend, handle)
                raise KineticJobCancelled(
                    f"kinetic job {handle.job_id} cancelled at the task's execution_timeout",
                    job_id=handle.job_id,
                )
            delay = next(delays)
            if give_up is not None:
                delay = max(0.0, min(delay, give_up - time.monotonic()))
            backend.wait([handle], delay)

    def _show_logs(self, backend: Backend, handle: JobHandle, offset: int) -> int:
        text, new_offset = backend.read_logs(handle, offset)
        for line in text.splitlines():
            self.log.info("[%s] %s", handle.job_id, line)
        return new_offset

    def _finish(
        self,
        context: Any,
        store: ObjectStore,
        backend: Backend,
        handle: JobHandle,
        report: StatusReport,
        offset: int,
    ) -> Any:
        self._show_logs(backend, handle, offset)
        self.log.info("kinetic job %s finished: %s", handle.job_id, report.describe())
        try:
            value, blob = collect_with_blob(
                store, handle.job_id, report.status, report.reason, result_key=result_key(handle)
            )
        except Exception as exc:
            tb = next((n for n in getattr(exc, "__notes__", []) if n.startswith("Remote")), None)
            self.log.error(
                "kinetic job %s failed: %s: %s%s",
                handle.job_id,
                type(exc).__name__,
                exc,
                "\n" + tb if tb else "",
            )
            try:  # its log archived before the Job (and its pods) go
                self._ended(store, backend, handle, report, describe_failure(exc))
            finally:
                self._delete_job(backend, handle)
            self._usage(context, store, handle)
            raise KineticJobFailed(
                f"kinetic job {handle.job_id} failed: {describe_failure(exc)}",
                job_id=handle.job_id,
            ) from exc
        multiple = bool(getattr(self, "multiple_outputs", False))
        delivered = xcom_value(value, store, handle.job_id, blob, self.log, multiple)
        push_value(self, context, delivered)  # Airflow has it before anything is deleted
        self._write_record(context, store, handle, delivered=True)
        try:
            self._ended(store, backend, handle, report, None, result_ref_uris(delivered))
        finally:
            self._delete_job(backend, handle)
        self._usage(context, store, handle)
        if deletes(self.cleanup, True):  # done for good: nothing will resume from them
            try:
                remove_checkpoints(store, task_identity(context))
            except Exception as exc:  # noqa: BLE001 - the value is delivered already
                self.log.warning("could not delete the task's checkpoints: %s", exc)
        return delivered

    def _usage(self, context: Any, store: ObjectStore, handle: JobHandle) -> None:
        """The task's usage over every job its run had (the record's attempts)."""
        try:
            record = read_record(store, task_identity(context), deployment_secret())
        except Exception:  # noqa: BLE001 - then this job alone
            record = None
        attempts = record.attempts if record is not None and record.attempts else []
        report_usage(self, context, store, attempts or [handle.job_id])

    def _delete_job(self, backend: Backend, handle: JobHandle) -> None:
        """Collected (value or error): the Job / LeaderWorkerSet goes now, whatever the
        outcome (a LeaderWorkerSet has no TTL; a failed job may hold a stuck pod)."""
        self._handle = None  # done: on_kill must not touch a finished job
        try:
            backend.cancel(handle)
        except Exception as exc:  # noqa: BLE001 - keep the job's own outcome
            self.log.warning("could not delete job %s: %s", handle.job_id, exc)

    def _ended(
        self,
        store: ObjectStore,
        backend: Backend,
        handle: JobHandle,
        report: StatusReport,
        failure: str | None,
        kept_uris: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """History and the cleanup policy for a job whose outcome was collected.  A
        job that succeeded but whose result could not be read (the store, a key) is
        left exactly as it is: a retry collects it, nothing runs twice."""
        state = report.status.value
        if failure is not None and cancel_requested(store, handle):
            state = history.CANCELLED  # stopped on purpose: not the function's failure
        if failure is not None and report.status is JobStatus.SUCCEEDED:
            history.update(store, handle.job_id, state, f"not collected: {failure}")
            return
        history.update(store, handle.job_id, state, failure or report.reason)
        after_job(
            store,
            backend,
            [handle],
            succeeded=failure is None,
            mode=self.cleanup,
            kept_uris=kept_uris,
            log_=self.log,
            archive_logs=True,
        )
