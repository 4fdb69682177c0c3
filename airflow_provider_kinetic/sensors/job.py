"""KineticJobSensor: wait for a kinetic job another task submitted (by its handle).

Typical use: a task submits with ``KineticRunOperator`` and a downstream sensor in
another DAG (or after a restart) waits on the ``kinetic_job`` XCom.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseSensorOperator, PokeReturnValue, conf

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY
from airflow_provider_kinetic.core.jobs.cleanup import policy as cleanup_policy
from airflow_provider_kinetic.core.jobs.finish import finish_job
from airflow_provider_kinetic.core.spec.handles import (
    InvalidHandleError,
    JobHandle,
    parse_rendered,
)
from airflow_provider_kinetic.deployment.signing import result_key
from airflow_provider_kinetic.exceptions import KineticJobFailed, job_failed
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.operators import end_task
from airflow_provider_kinetic.operators.common import task_identity
from airflow_provider_kinetic.operators.lineage import KineticJobSensorLineage
from airflow_provider_kinetic.operators.xcoms import xcom_value
from airflow_provider_kinetic.triggers.job import KineticJobTrigger


class KineticJobSensor(KineticJobSensorLineage, BaseSensorOperator):
    """Succeed when the job is SUCCEEDED; fail when it is FAILED or NOT_FOUND.

    :param handle: the JobHandle dict, or its JSON (e.g. a templated ``xcom_pull``).
    :param kinetic_conn_id: the connection the job was submitted through.
    :param deferrable: wait in the triggerer instead of poking; without
        ``return_result`` (and with nothing else to run on a worker after the job:
        ``operators.end_task``) the trigger ends the task when the job succeeds.
    :param return_result: return the job's value as this sensor's XCom (verified like
        the operator's; a reference when it does not fit XCom) — "submit now, wait
        later" with ``KineticRunOperator(wait_for_completion=False)``.
    :param cleanup: what the job leaves once this sensor saw it end, as the operator's
        ``cleanup`` (``core.jobs.cleanup``): "on_success" (default) deletes the job's
        artifacts once it succeeded, so a value not returned (``return_result=False``)
        is not kept; "always"; "never".
    """

    template_fields: Sequence[str] = ("handle",)

    def __init__(
        self,
        *,
        handle: dict[str, Any] | str,
        kinetic_conn_id: str = KineticHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        return_result: bool = False,
        cleanup: str = DEFAULT_POLICY,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cleanup = cleanup_policy(cleanup)
        self.return_result = return_result
        self.handle = handle
        self.kinetic_conn_id = kinetic_conn_id
        self.deferrable = deferrable

    def _handle(self) -> JobHandle:
        """The handle, from a dict or from a rendered template string.

        A template like ``"{{ ti.xcom_pull(...) }}"`` renders a dict as its Python
        repr (single quotes, ``True``), which is not JSON: read it as a Python
        literal, never by editing quotes.
        """
        value = self.handle
        if isinstance(value, str):
            try:
                value = parse_rendered(value)
            except (ValueError, SyntaxError) as exc:
                raise InvalidHandleError(
                    f"handle is neither JSON nor a Python dict literal: {value!r:.200}"
                ) from exc
        return JobHandle.from_dict(value)

    def poke(self, context: Any) -> bool | PokeReturnValue:
        handle = self._handle()
        hook = KineticHook(self.kinetic_conn_id)
        backend = hook.get_backend(handle.backend)
        store = hook.get_store()
        report = backend.status(handle)
        # Collected already (by the task that submitted it, say), its backend state
        # released: the store's history says how it ended.
        report = history.settled(store, handle.job_id, report)
        self.log.info("kinetic job %s: %s", handle.job_id, report.describe())
        if not report.status.is_terminal:
            return False
        # The same finish as the submitting operator's (``core.jobs.finish``): a result
        # that cannot be read (the store, a key) leaves the job's artifacts as they
        # are, so a retry of this sensor collects it.
        done = finish_job(
            store,
            backend,
            handle,
            report,
            cleanup=self.cleanup,
            result_key=result_key(handle),
            read_value=self.return_result,
            deliver=lambda value, blob: xcom_value(value, store, handle.job_id, blob, self.log),
            log_=self.log,
        )
        if done.error is not None:  # a failed job: its own error, with the remote traceback
            if done.classified is not None:
                self.log.error("kinetic job %s %s", handle.job_id, done.classified.describe())
            raise job_failed(
                f"kinetic job {handle.job_id} failed: {done.failure}",
                done.classified,
                handle.job_id,
            ) from done.error
        if not done.succeeded:
            raise KineticJobFailed(
                f"kinetic job {handle.job_id} {report.describe()}", job_id=handle.job_id
            )
        return PokeReturnValue(True, done.value) if self.return_result else True

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if done:
            return done.xcom_value if isinstance(done, PokeReturnValue) else None
        hook = KineticHook(self.kinetic_conn_id)
        self.defer(
            trigger=KineticJobTrigger(
                handle=self._handle().to_dict(),
                config=config_to_json(hook.get_config()),
                poll_interval=self.poke_interval,
                cancel_on_kill=False,  # the sensor does not own the job
                stream_logs=False,  # the task that submitted it shows its log
                end_task=end_task.decide(self, task_identity(context), collect=False),
            ),
            method_name="execute_complete",
        )
        return None

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """The trigger saw the job end: read its state again and finish as ``poke``."""
        done = self.poke(context)
        if not done:
            raise KineticJobFailed(
                f"kinetic job trigger ended {(event or {}).get('status')} "
                f"({(event or {}).get('message')}) while the job is still running"
            )
        return done.xcom_value if isinstance(done, PokeReturnValue) else None
