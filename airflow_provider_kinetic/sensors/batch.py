"""KineticBatchSensor: wait for a batch that ``KineticMapOperator(wait_for_completion=False)``
submitted, and return its results.

The submitting task only starts the first ``max_concurrent`` children, so the sensor
is the batch's driver from then on: each poke folds the children's statuses into
the batch state, shows their new log lines, retries failed children (the batch's
``retries``), applies ``fail_fast``, and launches queued inputs under the cap, as
the map operator would.  The state lives in memory between pokes, rides the
batch trigger while deferred, and is saved sealed in the store
(``_groups/{id}/live.json``) whenever it changes, so reschedule-mode pokes and a
retried sensor continue from it.  The sensor does not own the children: a kill or
a sensor timeout leaves running children running.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import BaseSensorOperator, PokeReturnValue, conf

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.finish import batch_ended, gather_values
from airflow_provider_kinetic.core.batch.resume import load_live, save_live
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY
from airflow_provider_kinetic.core.jobs.cleanup import policy as cleanup_policy
from airflow_provider_kinetic.core.jobs.resultref import result_ref_uris
from airflow_provider_kinetic.core.logat import info_at
from airflow_provider_kinetic.core.spec.handles import parse_rendered
from airflow_provider_kinetic.deployment.signing import (
    deployment_secret,
    result_key_for_job,
)
from airflow_provider_kinetic.exceptions import KineticBatchFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.operators.lineage import KineticBatchSensorLineage
from airflow_provider_kinetic.operators.xcoms import xcom_value
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


def group_id_of(batch: dict[str, Any] | str) -> str:
    """The group id of a batch handle: its dict, JSON, or a rendered template (a dict
    rendered by Jinja is a Python literal, not JSON), or the bare id."""
    value: Any = batch
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("{"):
            return text
        try:
            value = parse_rendered(text)
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"batch is not a kinetic batch handle: {text!r:.200}") from exc
    if not isinstance(value, dict) or not value.get("group_id"):
        raise ValueError(f"batch is not a kinetic batch handle: {value!r:.200}")
    return str(value["group_id"])


class KineticBatchSensor(KineticBatchSensorLineage, BaseSensorOperator):
    """Succeed when every child of the batch is done; fail like the map operator.

    :param batch: the batch handle ``KineticMapOperator(wait_for_completion=False)``
        returns (dict, its JSON or rendered template), or the group id.
    :param kinetic_conn_id: the connection the batch was submitted through.
    :param deferrable: wait in the triggerer instead of poking.
    :param return_result: return the children's values in input order as this sensor's
        XCom (verified; references when they do not fit XCom).
    :param child_log_bytes_per_poll: new log bytes of each running child written into
        this task's log per poke, prefixed ``[child N]`` (``0``: none).
    :param cleanup: what the children leave once the batch is done, as the map
        operator's ``cleanup`` (``core.jobs.cleanup``; default "on_success").

    :raises KineticBatchFailed: some inputs failed (``fail_fast`` as the batch was
        planned); ``partial_results`` holds every position in input order.
    """

    template_fields: Sequence[str] = ("batch",)
    ui_color = "#d2e3fc"

    def __init__(
        self,
        *,
        batch: dict[str, Any] | str,
        kinetic_conn_id: str = KineticHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        return_result: bool = False,
        child_log_bytes_per_poll: int = batchlogs.LOG_BYTES_PER_POLL,
        cleanup: str = DEFAULT_POLICY,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cleanup = cleanup_policy(cleanup)
        self.batch = batch
        self.kinetic_conn_id = kinetic_conn_id
        self.deferrable = deferrable
        self.return_result = return_result
        self.child_log_bytes_per_poll = child_log_bytes_per_poll
        self._state: BatchState | None = None

    @cached_property
    def hook(self) -> KineticHook:
        return KineticHook(self.kinetic_conn_id)

    # ---- one step of the batch ------------------------------------------------------
    def poke(self, context: Any) -> bool | PokeReturnValue:
        if self.batch in ([], (), "[]"):  # a map over no inputs submitted nothing
            self.log.info("kinetic: the batch had no inputs: nothing to wait for; the value is []")
            return PokeReturnValue(True, []) if self.return_result else True
        hook = self.hook
        store, config = hook.get_store(), hook.get_config()
        secret = deployment_secret()
        state = self._state or load_live(store, group_id_of(self.batch), secret)
        self._state = state
        backend = hook.get_backend(state.backend)
        before = (dict(state.done), dict(state.launches), state.stopped)
        offsets = {k: list(v) for k, v in state.log_offsets.items()}
        handles = list(state.active.values())
        reports = backend.batch_status(state.group_id, handles) if handles else {}
        batchlogs.show(state, backend, reports, self._child_line, self.child_log_bytes_per_poll)
        auth = state.template.result_auth
        keys = lambda child: result_key_for_job(child.job_id, auth)  # noqa: E731
        for index in batchrun.observe(state, reports, backend, store, payload_key=keys):
            if state.done[index] != "SUCCEEDED":
                report = reports.get(state.jobs[index])
                why = report.describe() if report else state.done[index]
                self.log.warning("inputs[%d] (%s): %s", index, state.jobs[index], why)
        batchlogs.forget_finished(state)
        batchlaunch.launch(state, config, backend, store, secret)
        batchmanifest.maybe_write_manifest(state, store)
        changed = before != (dict(state.done), dict(state.launches), state.stopped)
        if changed or (self.mode == "reschedule" and offsets != state.log_offsets):
            save_live(store, state, secret)
        c = batchrun.counts(state)
        self.log.info(
            "batch %s: succeeded %d, failed %d, active %d, queued %d of %d",
            state.group_id,
            c["succeeded"],
            c["failed"],
            c["active"],
            c["queued"],
            c["total"],
        )
        if not state.finished:
            return False
        return self._finish(state, store, backend)

    def _child_line(self, index: int, line: str, ns: int | None) -> None:
        info_at(self.log, ns, "[child %d] %s", index, line)

    def _finish(self, state: BatchState, store: Any, backend: Backend) -> bool | PokeReturnValue:
        """Every child is done: the results in input order, or KineticBatchFailed
        (``core.batch.finish``, as the map operator finishes)."""
        gathered = gather_values(
            state,
            store,
            ordered=True,
            result_key=lambda job: result_key_for_job(job, state.template.result_auth),
            deliver=lambda value, job, blob: xcom_value(value, store, job, blob, self.log),
        )
        values, failures = gathered.values, gathered.failures
        kept = result_ref_uris(values) if self.return_result else set()
        batch_ended(
            state,
            store,
            backend,
            delivered=not failures,
            cleanup=self.cleanup,
            kept_uris=kept,
            log_=self.log,
        )
        if failures:
            raise KineticBatchFailed(
                batchlogs.failure_summary(state, failures),
                group_id=state.group_id,
                failures=failures,
                partial_results=values,
            )
        return PokeReturnValue(True, values) if self.return_result else True

    # ---- deferrable ---------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        return self._step_or_defer(context)

    def _step_or_defer(self, context: Any) -> Any:
        done = self.poke(context)
        if done:
            return done.xcom_value if isinstance(done, PokeReturnValue) else None
        assert self._state is not None
        self.defer(
            trigger=KineticBatchTrigger(
                state=self._state.to_dict(),
                config=config_to_json(self.hook.get_config()),
                poll_interval=self.poke_interval,
                cancel_on_kill=False,  # the sensor does not own the children
                log_bytes_per_poll=self.child_log_bytes_per_poll,
            ),
            method_name="execute_complete",
        )
        return None

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume from the state the trigger carried back (log offsets included)."""
        if event and event.get("state"):
            self._state = BatchState.from_dict(event["state"])
        if event and event.get("status") == "error":
            self.log.warning("batch trigger ended with an error: %s", event.get("message"))
        return self._step_or_defer(context)
