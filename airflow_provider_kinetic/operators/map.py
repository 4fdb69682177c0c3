"""KineticMapOperator: one task fans a function out over many inputs.

Unlike Airflow's dynamic task mapping (capped at ``[core] max_map_length``), one task
drives the whole batch: children are submitted under ``max_concurrent``, retried,
optionally stopped on the first failure, and their results collected in order.
The batch state travels across deferrals in ``defer(kwargs=...)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core import batchrun
from airflow_provider_kinetic.core.accelerators import parse_accelerator
from airflow_provider_kinetic.core.backends.base import Backend, StatusReport
from airflow_provider_kinetic.core.batch import plan_batch
from airflow_provider_kinetic.core.submit import JobRequest
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.operators.common import (
    XCOM_BATCH,
    KineticOperatorBase,
    by_value_roots,
    deadline,
    default_output_key,
    defer_timeout,
    task_identity,
)
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


class KineticMapOperator(KineticOperatorBase):
    """Run ``python_callable`` once per input as kinetic jobs; return results in order.

    Args:
        python_callable: the function.
        inputs: list of inputs (templated; may be an upstream XComArg).
        input_mode: ``auto`` (identifier-keyed dict -> kwargs, list/tuple -> args,
            else one positional), ``single``, ``args`` or ``kwargs``.
        op_kwargs: keyword arguments shared by every child (templated).
        max_concurrent: children running at once.
        retries: re-submissions of a failed child (new job id). Preemptions are
            retried apart from this budget. This is kinetic's per-child ``retries``;
            the task's own Airflow retries are ``task_retries`` (a ``retries`` in
            ``default_args`` also lands here, as for any operator argument).
        fail_fast: on the first failure launch nothing more and cancel running siblings.
        return_exceptions: failed positions hold an error dict instead of failing the task.
        ordered: results in input order (else completion order).
        accelerator, volumes, capture_env_vars, kinetic_conn_id, deferrable,
        poll_interval, cpu, memory: as for KineticRunOperator.
    """

    template_fields: Sequence[str] = ("inputs", "op_kwargs", "volumes", "output_dir", "accelerator")
    ui_color = "#d2e3fc"

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        inputs: Any,
        input_mode: str = "auto",
        op_kwargs: Mapping[str, Any] | None = None,
        max_concurrent: int = 64,
        retries: int = 0,
        fail_fast: bool = False,
        return_exceptions: bool = False,
        ordered: bool = True,
        group_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        # ``retries`` is the per-child budget; the task's own Airflow retries stay
        # available as ``task_retries``.
        task_retries = kwargs.pop("task_retries", None)
        if task_retries is not None:
            kwargs["retries"] = task_retries
        super().__init__(**kwargs)
        self.python_callable = self.require_callable(python_callable)
        self.inputs = inputs
        self.input_mode = input_mode
        self.op_kwargs = op_kwargs
        self.max_concurrent = max_concurrent
        self.child_retries = retries
        self.fail_fast = fail_fast
        self.return_exceptions = return_exceptions
        self.ordered = ordered
        self.group_name = group_name
        self._state: dict[str, Any] | None = None
        self._backend: Backend | None = None

    # ---- execute -------------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        hook = KineticHook(self.kinetic_conn_id)
        store = hook.get_store()
        identity = task_identity(context)
        request = JobRequest(
            func=self.python_callable,
            kwargs=dict(self.op_kwargs or {}),
            accelerator=self.accelerator,
            volumes=self.rendered_volumes(context),
            capture_env_vars=self.capture_env_vars,
            output_dir=self.output_dir or store.uri(default_output_key(identity)),
            identity=identity,
            by_value_roots=by_value_roots(),
            cpu_request=self.cpu,
            memory_request=self.memory,
        )
        state, objects, local = plan_batch(
            request,
            self.inputs,
            self.input_mode,
            store,
            max_concurrent=self.max_concurrent,
            retries=self.child_retries,
            fail_fast=self.fail_fast,
            group_name=self.group_name or self.task_id,
            tags=[identity["dag_id"], identity["task_id"]],
        )
        state["deadline"] = deadline(context, self.execution_timeout)
        state["plan"]["backend"] = hook.get_config().backend_kind(
            parse_accelerator(self.accelerator)
        )
        self.log.info(
            "batch %s: %d inputs, max_concurrent=%d",
            state["group_id"],
            state["total"],
            state["max_concurrent"],
        )
        batchrun.start_batch(state, objects, local, store)
        return self._advance(context, hook, state)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume: re-read the real status of active children, then continue."""
        state = (event or {}).get("state")
        if not state:
            raise AirflowException(f"kinetic batch resumed without its state (event {event!r})")
        hook = KineticHook(self.kinetic_conn_id)
        if event["status"] in ("error", "timeout"):
            self.log.warning(
                "batch trigger ended with %s: %s", event["status"], event.get("message")
            )
            if event["status"] == "timeout":
                self._state = state
                self._backend = hook.get_backend(state["plan"]["backend"])
                self.on_kill()
                raise AirflowException(
                    f"kinetic batch {state['group_id']} cancelled at the task's execution_timeout"
                )
        self._poll(hook.get_backend(state["plan"]["backend"]), hook.get_store(), state)
        return self._advance(context, hook, state)

    # ---- the loop ------------------------------------------------------------------
    def _poll(self, backend: Backend, store: Any, state: dict[str, Any]) -> None:
        handles = list(state["active"].values())
        reports = backend.batch_status(state["group_id"], handles) if handles else {}
        for index in batchrun.observe(state, reports, backend, store):
            job = state["jobs"][str(index)]
            self._log_child(index, job, state["done"][str(index)], reports.get(job))

    def _log_child(self, index: int, job: str, outcome: str, report: StatusReport | None) -> None:
        if outcome != "SUCCEEDED":
            why = report.describe() if report else outcome
            self.log.warning("inputs[%d] (%s) %s: %s", index, job, outcome.lower(), why)

    def _advance(self, context: Any, hook: KineticHook, state: dict[str, Any]) -> Any:
        config, store = hook.get_config(), hook.get_store()
        backend = hook.get_backend(state["plan"]["backend"])
        self._state, self._backend = state, backend
        while True:
            batchrun.launch(state, config, backend, store)
            batchrun.maybe_write_manifest(state, store)
            self._report(context, state, store)
            if batchrun.is_finished(state):
                return self._complete(state, store)
            if state.get("deadline") and time.time() >= state["deadline"]:
                self.on_kill()
                raise AirflowException(
                    f"kinetic batch {state['group_id']} cancelled at the task's execution_timeout"
                )
            if self.deferrable:
                self.defer(
                    trigger=KineticBatchTrigger(
                        state=state,
                        config=config_to_json(config),
                        poll_interval=self.poll_interval,
                        deadline=state.get("deadline"),
                    ),
                    method_name="execute_complete",
                    timeout=defer_timeout(state.get("deadline"), self.poll_interval),
                )
            time.sleep(self.poll_interval)
            self._poll(backend, store, state)

    def _report(self, context: Any, state: dict[str, Any], store: Any) -> None:
        c = batchrun.counts(state)
        self.log.info(
            "batch %s: submitted %d/%d, active %d, succeeded %d, failed %d, queued %d",
            state["group_id"],
            c["submitted"],
            c["total"],
            c["active"],
            c["succeeded"],
            c["failed"],
            c["queued"],
        )
        context["ti"].xcom_push(
            key=XCOM_BATCH,
            value={
                "group_id": state["group_id"],
                "bucket": store.bucket,
                "manifest_uri": store.uri(batchrun.manifest_key(state["group_id"])),
                "output_dir": state["plan"]["output_base"],
                "counts": c,
            },
        )

    def _complete(self, state: dict[str, Any], store: Any) -> list[Any]:
        if state.get("manifest_dirty"):
            batchrun.write_manifest(state, store)
        values, failures = batchrun.gather(state, store, ordered=self.ordered)
        self._state = None
        if failures and not self.return_exceptions:
            lines = [
                f"  inputs[{i}] ({state['jobs'].get(str(i), 'not submitted')}): "
                f"{type(e).__name__}: {e}"
                for i, e in sorted(failures.items())
            ]
            raise AirflowException(
                f"kinetic batch {state['group_id']}: {len(failures)} of {state['total']} "
                "inputs failed (results of the others stay in the store):\n" + "\n".join(lines)
            )
        return [
            batchrun.describe_exception(v) if isinstance(v, BaseException) else v for v in values
        ]

    def on_kill(self) -> None:
        """Cancel every child this try has running."""
        if self._state and self._backend:
            for handle in list(self._state["active"].values()):
                self._backend.cancel(handle)
            self.log.info(
                "cancelled %d children of batch %s",
                len(self._state["active"]),
                self._state["group_id"],
            )
