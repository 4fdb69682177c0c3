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
from airflow_provider_kinetic.core.backends.k8s.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.resume import save_live, save_plan
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.catalog.capacity import DEFAULT_CAPACITY_WAIT_S
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.checkpoint import DEFAULT_SYNC_S
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.jobs.taskrecord import (
    request_cancel,
)
from airflow_provider_kinetic.core.keys import databroadcast
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.exceptions import KineticJobCancelled
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.links import KineticBatchLink, batch_url
from airflow_provider_kinetic.operators import assets, keyio
from airflow_provider_kinetic.operators.capacity import CAPACITY_TEMPLATE_FIELDS
from airflow_provider_kinetic.operators.common import (
    DEFAULT_DEFERRABLE,
    deadline,
    defer_grace_s,
    defer_timeout,
    rendered_as,
    task_identity,
)
from airflow_provider_kinetic.operators.map_tries import MapTriesBase, push_output_dirs
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


class KineticMapOperator(MapTriesBase):
    """Run ``python_callable`` once per input as kinetic jobs; return results in order.

    Each child is the same job template as a ``KineticRunOperator`` job, plus its input.

    :param python_callable: the function, run once per input.
    :param inputs: list of inputs (templated; may be an upstream XComArg).
    :param input_mode: ``auto`` (identifier-keyed dict -> kwargs, list/tuple -> args,
        else one positional), ``single``, ``args`` or ``kwargs``.
    :param op_kwargs: keyword arguments shared by every child (templated).
    :param max_concurrent: children running at once.
    :param input_retries: re-submissions of a failed input's child (new job id), within
        the try. Preemptions are retried apart from this budget.  (``retries`` is the
        task's Airflow retries, as on every operator: a retry resumes the batch, only
        failed or missing inputs run again.)
    :param fail_fast: on the first failure launch nothing more and cancel running siblings.
    :param return_exceptions: failed positions hold an error dict instead of failing the task.
    :param ordered: results in input order (else completion order).
    :param group_name: the group's name in kinetic's manifest (default: the task id).
    :param wait_for_completion: ``False`` submits the batch (its first ``max_concurrent``
        children), pushes the batch handle and succeeds at once (its return value is
        the handle); a ``KineticBatchSensor`` waits for it later, launching the rest,
        and with ``return_result=True`` returns the results.
    :param child_log_bytes_per_poll: new log bytes of each running child written into
        the task log per poll, prefixed ``[child N]`` (the rest comes next poll; ``0``
        turns live child logs off).
    :param output_asset: as for KineticRunOperator, with one event for the batch: its
        parent output dir (the children's dirs and values in the extra, when they fit
        in 4 KiB).
    :param broadcast: ``True`` or a ``BroadcastWindow`` (its fanout and timeout): the
        children's shared ``Data`` travels as a tree, one child reading the store and
        the rest each other (``core/keys/databroadcast.py``).
    :param accelerator: what each child runs on, as for KineticRunOperator (templated).
    :param volumes: ``{"/abs/mount/path": Data(...)}`` every child sees (templated).
    :param output_dir: the batch's parent output dir (templated); child ``i`` writes
        under ``{output_dir}/{i}``.
    :param capture_env_vars: as for KineticRunOperator (templated).
    :param kinetic_conn_id: a ``kinetic`` connection; absent default = local backend.
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param poll_interval: seconds between status reads.
    :param cpu: CPU request for cpu jobs on GKE.
    :param memory: memory request for cpu jobs on GKE.
    :param spot: run on spot VMs, as for KineticRunOperator.
    :param cleanup: what each ended child leaves, as for KineticRunOperator.
    :param context_excludes: as for KineticRunOperator.
    :param container_image: as for KineticRunOperator (built once for every child).
    :param requirements: as for KineticRunOperator (templated).
    :param capacity: as for KineticRunOperator (templated).
    :param capacity_wait: as for KineticRunOperator (templated).
    :param priority_class: as for KineticRunOperator (templated).
    :param max_run_duration: as for KineticRunOperator (templated).
    :param checkpoint_sync_s: as for KineticRunOperator.

    :raises KineticBatchFailed: some inputs failed (``partial_results`` holds every
        position).
    :raises KineticJobCancelled: the batch was cancelled at the task's execution_timeout.
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
        broadcast: bool | BroadcastWindow = False,
        accelerator: str = "cpu",
        volumes: dict[str, Any] | None = None,
        output_dir: str | None = None,
        capture_env_vars: list[str] | None = None,
        kinetic_conn_id: str = "kinetic_default",
        deferrable: bool = DEFAULT_DEFERRABLE,
        poll_interval: float = 5.0,
        cpu: str | None = None,
        memory: str | None = None,
        spot: bool = False,
        cleanup: str = DEFAULT_POLICY,
        context_excludes: list[str] | None = None,
        container_image: str | None = None,
        requirements: list[str] | str | None = None,
        capacity: str | list[str] | None = None,
        capacity_wait: Any = DEFAULT_CAPACITY_WAIT_S,
        priority_class: str | None = None,
        max_run_duration: Any = None,
        checkpoint_sync_s: float = DEFAULT_SYNC_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            volumes=volumes,
            output_dir=output_dir,
            capture_env_vars=capture_env_vars,
            kinetic_conn_id=kinetic_conn_id,
            deferrable=deferrable,
            poll_interval=poll_interval,
            cpu=cpu,
            memory=memory,
            spot=spot,
            cleanup=cleanup,
            context_excludes=context_excludes,
            container_image=container_image,
            requirements=requirements,
            capacity=capacity,
            capacity_wait=capacity_wait,
            priority_class=priority_class,
            max_run_duration=max_run_duration,
            checkpoint_sync_s=checkpoint_sync_s,
            **kwargs,
        )
        self.broadcast = databroadcast.window_of(broadcast)
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
            state.backend,
            state.group_id,
            config.project or "",
            config.cluster or "",
            config.namespace,
            self.kinetic_conn_id,
        )
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
        batchmanifest.write_manifest(state, store)
        save_live(store, state, deployment_secret())
        self._report(context, state, store)
        self._write_record(context, store, state, delivered=True)
        push_output_dirs(context, state)
        self._state = None  # nobody waits here: on_kill must not cancel the children
        return batchmanifest.batch_handle(state, store)

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
            batchmanifest.maybe_write_manifest(state, store)
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

    def on_kill(self) -> None:
        """Cancel every child this try has running."""
        if self._state and self._backend:
            for handle in list(self._state.active.values()):
                request_cancel(self._store, self._backend, handle)
            self.log.info(
                "cancelled %d children of batch %s", len(self._state.active), self._state.group_id
            )
