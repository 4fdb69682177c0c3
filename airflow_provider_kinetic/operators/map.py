"""KineticMapOperator: one task fans a function out over many inputs.

Unlike Airflow's dynamic task mapping (capped at ``[core] max_map_length``), one task
drives the whole batch: children are submitted under ``max_concurrent``, retried,
optionally stopped on the first failure, and their results collected in order.
The batch state travels across deferrals in ``defer(kwargs=...)``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.resume import save_live, save_plan
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.jobs.taskrecord import (
    request_cancel,
)
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.exceptions import KineticJobCancelled
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.hooks.signing import deployment_secret
from airflow_provider_kinetic.links import KineticBatchLink, batch_url
from airflow_provider_kinetic.operators import assets, keyio
from airflow_provider_kinetic.operators.capacity import CAPACITY_TEMPLATE_FIELDS
from airflow_provider_kinetic.operators.common import (
    XCOM_BATCH,
    XCOM_OUTPUT_DIR,
    XCOM_OUTPUT_DIRS,
    deadline,
    defer_grace_s,
    defer_timeout,
    directory_uri,
    rendered_as,
    task_identity,
)
from airflow_provider_kinetic.operators.map_tries import MapTriesBase
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


class KineticMapOperator(MapTriesBase):
    """Run ``python_callable`` once per input as kinetic jobs; return results in order.

    Args:
        python_callable: the function.
        inputs: list of inputs (templated; may be an upstream XComArg).
        input_mode: ``auto`` (identifier-keyed dict -> kwargs, list/tuple -> args,
            else one positional), ``single``, ``args`` or ``kwargs``.
        op_kwargs: keyword arguments shared by every child (templated).
        max_concurrent: children running at once.
        input_retries: re-submissions of a failed input's child (new job id), within
            the try. Preemptions are retried apart from this budget.
        retries: the task's Airflow retries, as on every operator (so
            ``default_args={"retries": 2}`` means what it means elsewhere); a retry
            resumes the batch (only failed or missing inputs run again).
        fail_fast: on the first failure launch nothing more and cancel running siblings.
        return_exceptions: failed positions hold an error dict instead of failing the task.
        ordered: results in input order (else completion order).
        wait_for_completion: ``False`` submits the batch (its first ``max_concurrent``
            children), pushes the batch handle and succeeds at once (its return value
            is the handle); a ``KineticBatchSensor`` waits for it later, launching the
            rest, and with ``return_result=True`` returns the results.
        child_log_bytes_per_poll: new log bytes of each running child written into
            the task log per poll, prefixed ``[child N]`` (the rest comes next poll;
            ``0`` turns live child logs off).
        output_asset: as for KineticRunOperator, with one event for the batch: its
            parent output dir (the children's dirs and values in the extra, when
            they fit in 4 KiB).
        accelerator, spot, volumes, output_dir, capture_env_vars, kinetic_conn_id,
        deferrable, poll_interval, cpu, memory: as for KineticRunOperator (each child
        is the same job template plus its input).

    Raises:
        KineticBatchFailed: some inputs failed (``partial_results`` holds every position).
        KineticJobCancelled: the batch was cancelled at the task's execution_timeout.
    """

    template_fields: Sequence[str] = (
        "inputs",
        "op_kwargs",
        "volumes",
        "output_dir",
        "accelerator",
        "capture_env_vars",
        "requirements",
        *CAPACITY_TEMPLATE_FIELDS,
    )
    ui_color = "#d2e3fc"
    operator_extra_links = (KineticBatchLink(),)
    #: Link key -> URL pushed in this execution segment (``links._XComLink``).
    published_links: dict[str, str] | None = None

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        inputs: Any,
        input_mode: str = "auto",
        op_kwargs: Mapping[str, Any] | None = None,
        max_concurrent: int = 64,
        input_retries: int = 0,
        fail_fast: bool = False,
        return_exceptions: bool = False,
        ordered: bool = True,
        group_name: str | None = None,
        wait_for_completion: bool = True,
        child_log_bytes_per_poll: int = batchlogs.LOG_BYTES_PER_POLL,
        output_asset: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (
            isinstance(input_retries, bool)
            or not isinstance(input_retries, int)
            or input_retries < 0
        ):
            raise ValueError(
                "input_retries (re-submissions of a failed input) must be an integer >= 0, "
                f"got {input_retries!r}"
            )
        self.input_retries = input_retries
        self.python_callable = self.require_callable(python_callable)
        self.inputs = inputs
        self.input_mode = input_mode
        self.op_kwargs = op_kwargs
        self.max_concurrent = max_concurrent
        self.fail_fast = fail_fast
        self.return_exceptions = return_exceptions
        self.ordered = ordered
        self.group_name = group_name
        self.wait_for_completion = wait_for_completion
        self.child_log_bytes_per_poll = child_log_bytes_per_poll
        self.output_asset = output_asset
        assets.setup(
            self,
            user_outlets=bool(kwargs.get("outlets")),
            argument_fields=("inputs", "op_kwargs", "volumes"),
        )
        self._state: BatchState | None = None
        self._line: batchlogs.StatusLine | None = None
        self._backend: Backend | None = None
        self._store: ObjectStore | None = None

    # ---- execute -------------------------------------------------------------------
    def plan(self, context: Any, store: ObjectStore, config: KineticConfig) -> tuple[Any, ...]:
        """Validate and pack the batch (the same request path as a single job)."""
        identity = task_identity(context) if context is not None else self._dry_identity()
        request = self.build_request(identity, store.uri, context)
        request, inputs = keyio.pin_batch(self, context, store, request, self.inputs)
        # The image once for every child; built (if missing) only when executing.
        self._image_plan = self.resolve_image(request, config, store, build=context is not None)
        return plan_batch(
            request,
            inputs,
            self.input_mode,
            store,
            config=config,
            max_concurrent=self.max_concurrent,
            retries=self.input_retries,
            fail_fast=self.fail_fast,
            group_name=self.group_name or self.task_id,
            tags=[identity["dag_id"], identity["task_id"]],
            signing_secret=deployment_secret(),
        )

    def _dry_identity(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "task_id": self.task_id, "run_id": "dry_run"}

    def execute(self, context: Any) -> Any:
        self.published_links = {}  # none yet: a failure before the batch has none
        rendered_as("inputs", self.inputs, list | tuple, "a list or tuple of inputs")
        if not self.inputs:  # as Airflow skips an expand() over []: succeed with nothing
            self.log.info("kinetic: no inputs (an empty list): nothing to run; the value is []")
            return []
        hook = KineticHook(self.kinetic_conn_id)
        config = hook.get_config()
        store = hook.get_store()
        planned = self.with_broadcast(self.plan(context, store, config))  # bad input fails here
        if self.output_asset:  # the rendered (or default) dir, before any job runs
            out = planned[0].template.output_dir
            assets.asset_uri(out, f"task {self.task_id!r}: output dir")
        state = self._resume(context, hook, store, planned[0].work)
        if state is None:
            state, objects, local = planned
            self.log.info(
                "batch %s: %d inputs, max_concurrent=%d",
                state.group_id,
                state.total,
                state.max_concurrent,
            )
            batchrun.start_batch(state, objects, local, store)
            save_plan(store, state, deployment_secret())
        if not self.wait_for_completion:
            return self._submit_only(context, hook, state)
        state.deadline = deadline(context, self.execution_timeout)
        self._write_record(context, store, state)
        push_output_dirs(context, state)
        url = batch_url(
            state.backend, state.group_id, config.project or "", config.cluster or "",
            config.namespace, self.kinetic_conn_id,
        )  # fmt: skip
        context["ti"].xcom_push(key=KineticBatchLink.key, value=url)
        self.published_links = {KineticBatchLink.key: url}
        return self._advance(context, hook, state)

    def _submit_only(self, context: Any, hook: KineticHook, state: BatchState) -> dict[str, Any]:
        """Submit now, wait later: the first children start, the state is saved for
        ``KineticBatchSensor`` (which launches the rest), the handle is the value."""
        config, store = hook.get_config(), hook.get_store()
        self._store = store  # the lineage methods read the batch's record from it
        backend = hook.get_backend(state.backend)
        batchrun.launch(state, config, backend, store, deployment_secret())
        batchrun.write_manifest(state, store)
        save_live(store, state, deployment_secret())
        self._report(context, state, store)
        self._write_record(context, store, state, delivered=True)
        push_output_dirs(context, state)
        self._state = None  # nobody waits here: on_kill must not cancel the children
        return batchrun.batch_handle(state, store)

    def dry_run(self) -> dict[str, Any]:
        """The manifest of the batch's first child, printed as YAML; creates nothing."""
        config = KineticHook(self.kinetic_conn_id).get_config()
        store = config.store()  # a dry run needs no credentials
        state, _, _ = self.with_broadcast(self.plan(None, store, config))
        spec = batchrun.child_spec(state, 0, "job-dryrun00", config, store, deployment_secret())
        manifest = backend_class(state.backend).manifest(spec)
        print("\n".join(self.image_report(self._image_plan, config)))
        print(to_yaml(manifest))
        return manifest

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume: re-read the real status of active children, then continue."""
        if not event or not event.get("state"):
            raise AirflowException(f"kinetic batch resumed without its state (event {event!r})")
        state = BatchState.from_dict(event["state"])
        hook = KineticHook(self.kinetic_conn_id)
        backend = hook.get_backend(state.backend)
        if event["status"] == "finished":  # driven to its end by the trigger: collect
            self.log.info("batch %s: every child has ended; collecting", state.group_id)
        if event["status"] in ("error", "timeout"):
            self.log.warning(
                "batch trigger ended with %s: %s", event["status"], event.get("message")
            )
            if event["status"] == "timeout":
                self._state, self._backend, self._store = state, backend, hook.get_store()
                self.on_kill()
                raise KineticJobCancelled(
                    f"kinetic batch {state.group_id} cancelled at the task's execution_timeout"
                )
        self._poll(backend, hook.get_store(), state)
        return self._advance(context, hook, state)

    # ---- the loop ------------------------------------------------------------------
    def _poll(self, backend: Backend, store: ObjectStore, state: BatchState) -> None:
        handles = list(state.active.values())
        reports = backend.batch_status(state.group_id, handles) if handles else {}
        # Before observe: it deletes finished children's Jobs (and their pod logs).
        batchlogs.show(state, backend, reports, self._child_line, self.child_log_bytes_per_poll)
        finished = batchrun.observe(state, reports, backend, store)
        batchlogs.log_failures(state, finished, reports, self.log)
        batchlogs.forget_finished(state)

    def _child_line(self, index: int, line: str) -> None:
        self.log.info("[child %d] %s", index, line)

    def _advance(self, context: Any, hook: KineticHook, state: BatchState) -> Any:
        config, store = hook.get_config(), hook.get_store()
        backend = hook.get_backend(state.backend)
        self._state, self._backend, self._store = state, backend, store
        delays = poll_delays(self.poll_interval, backend.first_poll_s)
        # Deferrable on the local backend: keep launching here while children end, and
        # defer once none has ended for DEFER_GRACE_S (each deferral costs a settle).
        watch = defer_grace_s() if backend.first_poll_s is not None else 0.0
        changed = time.monotonic()
        while True:
            batchrun.launch(state, config, backend, store, deployment_secret())
            batchrun.maybe_write_manifest(state, store)
            self._report(context, state, store)
            if state.finished:
                counts = batchrun.counts(state)  # before _complete: it may drop state
                result = self._complete(state, store, context)
                self._emit(context, state, result, counts["capacity"])
                return result
            if state.deadline and time.time() >= state.deadline:
                self.on_kill()
                raise KineticJobCancelled(
                    f"kinetic batch {state.group_id} cancelled at the task's execution_timeout"
                )
            if self.deferrable and time.monotonic() - changed >= watch:
                return self._defer(config, state)
            backend.wait(list(state.active.values()), next(delays))
            ended = len(state.done)
            self._poll(backend, store, state)
            if len(state.done) != ended:
                changed = time.monotonic()

    def _emit(self, context: Any, state: BatchState, result: Any, capacity: dict[str, int]) -> None:
        """The batch's asset event: its parent output dir (``operators.assets``)."""
        out = directory_uri(state.template.output_dir) or state.template.output_dir
        extra = assets.batch_extra(state, result, out, child_output_dirs(state), capacity)
        assets.emit(self, context, out, extra)

    def _defer(self, config: KineticConfig, state: BatchState) -> NoReturn:
        # The trigger drives the rest (launches, retries) and fires once at the end;
        # ``driver`` names this deferral, so its saves are never mistaken for another's.
        state.driver, state.seq = uuid.uuid4().hex, 0
        self.log.info(
            "batch %s: deferring until every child has ended (%d running, %d queued; "
            "the triggerer launches the rest)",
            state.group_id,
            len(state.active),
            len(state.queue),
        )
        self.defer(
            trigger=KineticBatchTrigger(
                state=state.to_dict(),
                config=config_to_json(config),
                poll_interval=self.poll_interval,
                deadline=state.deadline,
                log_bytes_per_poll=self.child_log_bytes_per_poll,
                drive=True,
            ),
            method_name="execute_complete",
            timeout=defer_timeout(state.deadline, self.poll_interval),
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def _report(self, context: Any, state: BatchState, store: ObjectStore) -> None:
        """The status line and the ``kinetic_batch`` XCom, when a count changed (the
        line also once a minute): not one line and one XCom write per poll."""
        c = batchrun.counts(state)
        key = tuple(v for k, v in c.items() if k != "capacity")
        if self._line is None:
            self._line = batchlogs.StatusLine()
        changed = key != self._line.last
        if not self._line.due(key):
            return
        self.log.info(
            "batch %s: submitted %d/%d, active %d, succeeded %d, failed %d, queued %d",
            state.group_id,
            c["submitted"],
            c["total"],
            c["active"],
            c["succeeded"],
            c["failed"],
            c["queued"],
        )
        if not changed:
            return
        context["ti"].xcom_push(
            key=XCOM_BATCH,
            value={
                "group_id": state.group_id,
                "bucket": store.bucket,
                "manifest_uri": store.uri(batchrun.manifest_key(state.group_id)),
                "output_dir": state.template.output_dir,
                "counts": c,
            },
        )

    def on_kill(self) -> None:
        """Cancel every child this try has running."""
        if self._state and self._backend:
            for handle in list(self._state.active.values()):
                request_cancel(self._store, self._backend, handle)
            self.log.info(
                "cancelled %d children of batch %s", len(self._state.active), self._state.group_id
            )


def push_output_dirs(context: Mapping[str, Any], state: Any) -> None:
    """A batch's ``output_dir`` (the parent) and ``kinetic_output_dirs`` (each input's
    own dir, in input order), so a downstream task finds a child's files without
    the function returning its ``KINETIC_OUTPUT_DIR``."""
    ti = context["ti"]
    ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(state.template.output_dir))
    ti.xcom_push(key=XCOM_OUTPUT_DIRS, value=child_output_dirs(state))


def child_output_dirs(state: Any) -> list[str]:
    """Each input's output dir of a batch, in input order, as ``Data`` takes it."""
    return [directory_uri(state.template.output_uri(i)) or "" for i in range(state.total)]
