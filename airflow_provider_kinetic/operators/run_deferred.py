"""KineticRunOperator's deferred wait: hand the job to the triggerer, resume after it.

While the task is deferred, ``KineticJobTrigger`` watches the job (and shows its log);
``execute_complete`` takes the job's final state from the event (reading it again only
when the event has none), re-defers after a trigger error, re-submits a preempted job,
and ends like the synchronous path (``run_sync``).
"""

from __future__ import annotations

from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.exceptions import KineticJobCancelled
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.operators.common import defer_timeout
from airflow_provider_kinetic.operators.run_sync import RunSyncWait
from airflow_provider_kinetic.triggers.job import KineticJobTrigger


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


class RunDeferredWait(RunSyncWait):
    """Deferring to the triggerer and resuming (see KineticRunOperator)."""

    MAX_REDEFER_ATTEMPTS = 3

    def _defer(
        self,
        config: KineticConfig,
        handle: JobHandle,
        deadline_ts: float | None,
        attempt: int,
        log_offset: int = 0,
    ) -> NoReturn:
        self.defer(
            trigger=KineticJobTrigger(
                handle=handle.to_dict(),
                config=config_to_json(config),
                poll_interval=self.poll_interval,
                deadline=deadline_ts,
                attempt=attempt,
                log_offset=log_offset,
            ),
            method_name="execute_complete",
            timeout=defer_timeout(deadline_ts, self.poll_interval),
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger: the job's final state from its event (re-read only
        when the event has none), the rest of its log, collect.

        A trigger *error* while the job still runs re-defers (up to
        ``MAX_REDEFER_ATTEMPTS``); a timeout, or errors beyond that, cancel the job.
        A preempted job is submitted again (``preemption_retries``) and waited for.
        """
        if not event or "handle" not in event:
            raise AirflowException(f"kinetic trigger returned no usable event: {event!r}")
        handle = JobHandle.from_dict(event["handle"])
        self._handle = handle
        hook = KineticHook(self.kinetic_conn_id)
        config = hook.get_config()
        store = hook.get_store()
        backend = hook.get_backend(handle.backend)
        self._backend, self._store = backend, store
        report = event_report(event)
        if report is None:  # no final answer from the trigger: ask the job itself
            report = backend.status(handle)
        self.log.info(
            "kinetic job %s resumed: trigger said %s, job is %s",
            handle.job_id,
            event.get("status"),
            report.describe(),
        )
        # The trigger showed the job's log up to here while the task was deferred.
        offset = int(event.get("log_offset") or 0)
        if report.status.is_terminal:
            fallback = self._next_capacity(context, config, backend, store, handle, report)
            if fallback is not None:
                return self._defer(config, fallback, event.get("deadline"), 0)
            if self._preempted(context, store, handle, report):
                handle = self._resubmit_preempted(context, config, backend, store, handle, report)
                return self._defer(config, handle, event.get("deadline"), 0)
            return self._finish(context, store, backend, handle, report, offset)
        attempt = int(event.get("attempt") or 0) + 1
        if event.get("status") == "error" and attempt <= self.MAX_REDEFER_ATTEMPTS:
            self.log.warning(
                "trigger error (%s); waiting again (%d/%d)",
                event.get("message"),
                attempt,
                self.MAX_REDEFER_ATTEMPTS,
            )
            return self._defer(config, handle, event.get("deadline"), attempt, offset)
        why = event.get("message") or event.get("status")
        request_cancel(store, backend, handle)
        self._show_logs(backend, handle, offset)
        raise KineticJobCancelled(
            f"kinetic job {handle.job_id} cancelled: trigger ended with "
            f"{event.get('status')} ({why}) while the job was {report.status.value}",
            job_id=handle.job_id,
        )
