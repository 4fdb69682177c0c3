"""KineticMapOperator: one task fans a function out over many inputs.

Unlike Airflow's dynamic task mapping (capped at ``[core] max_map_length``), one task
drives the whole batch: children are submitted under ``max_concurrent``, retried,
optionally stopped on the first failure, and their results collected in order.
The batch state travels across deferrals in ``defer(kwargs=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.backends.k8s.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.catalog.capacity import DEFAULT_CAPACITY_WAIT_S
from airflow_provider_kinetic.core.jobs.checkpoint import DEFAULT_SYNC_S, RESTORE_SAME_WORK
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY
from airflow_provider_kinetic.core.jobs.retry_on import ALLOWED, NEVER, input_policy
from airflow_provider_kinetic.core.keys import databroadcast
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.links import KineticBatchLink
from airflow_provider_kinetic.operators import assets, batch_finish, batch_wait, reuse
from airflow_provider_kinetic.operators import debug as debug_mode
from airflow_provider_kinetic.operators.batch_try import BatchTry
from airflow_provider_kinetic.operators.capacity import CAPACITY_TEMPLATE_FIELDS
from airflow_provider_kinetic.operators.common import (
    DEFAULT_DEFERRABLE,
    KineticOperatorBase,
    rendered_as,
)


class KineticMapOperator(KineticOperatorBase):
    """Run ``python_callable`` once per input as kinetic jobs; return results in order.

    Each child is the same job template as a ``KineticRunOperator`` job, plus its input.

    :param python_callable: the function, run once per input.
    :param inputs: list of inputs (templated; may be an upstream XComArg).
    :param input_mode: ``auto`` (identifier-keyed dict -> kwargs, list/tuple -> args,
        else one positional), ``single``, ``args`` or ``kwargs``.
    :param op_kwargs: keyword arguments shared by every child (templated).
    :param max_concurrent: children running at once.
    :param input_retries: re-submissions of a failed input's child (new job id), within
        the try: a count (any failure; preemptions are retried apart from it, up to 3),
        or, per input, ``retry_on``'s per-class form (``{"preemption": 3, "infra": 1,
        "user_error": 0}``, ``{"exit_codes": [42]}``, ``"never"``; preemptions get 3
        unless named).  (``retries`` is the
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
    :param checkpoint_restore: as for KineticRunOperator: ``"same_work"`` (default) restores
        an input's checkpoint only when this same work wrote it; ``"any"``: whatever work did.
    :param num_slices: only 1: each input runs as one job of one slice (more is refused).
    :param cache: ``True``, per input: an input whose work (the function, its arguments
        with the shared ``op_kwargs``, Data contents, options) has a delivered result takes
        it and its output dir, with no child launched (a re-run with one new input runs
        one child); XCom ``kinetic_cache`` says hit or miss per input.  Off by default.
    :param cache_version: as for KineticRunOperator: a string in every input's cache key.
    :param cache_ignore: as for KineticRunOperator: argument names whose values do not count.

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
        input_retries: int | dict[str, Any] | str = 0,
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
        checkpoint_restore: str = RESTORE_SAME_WORK,
        num_slices: Any = 1,
        cache: bool = False,
        cache_version: str | None = None,
        cache_ignore: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        debug_mode.refuse_on_map(kwargs)  # at parse time, naming why
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
            checkpoint_restore=checkpoint_restore,
            **kwargs,
        )
        if num_slices != 1:  # each input is one job of one slice
            raise ValueError(f"num_slices={num_slices!r}: KineticMapOperator runs one slice")
        self.broadcast = databroadcast.window_of(broadcast)
        per_class = isinstance(input_retries, Mapping) or input_retries == NEVER
        if per_class:  # retry_on's form: bad input fails here, naming what is allowed
            input_policy(input_retries)
        elif (
            isinstance(input_retries, bool)
            or not isinstance(input_retries, int)
            or input_retries < 0
        ):
            raise ValueError(
                "input_retries (re-submissions of a failed input) must be an integer >= 0, "
                f"got {input_retries!r}; or per class, {ALLOWED}"
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
        self.cache_settings = reuse.check(self, cache, cache_version, cache_ignore)
        assets.setup(
            self,
            user_outlets=bool(kwargs.get("outlets")),
            argument_fields=("inputs", "op_kwargs", "volumes"),
        )
        #: The try running in this execution segment (``on_kill`` cancels its children).
        self._try: BatchTry | None = None
        #: Its store, once it waits on its batch: the lineage methods read the batch's
        #: record from it (``operators/lineage.py``).
        self._store: ObjectStore | None = None

    @cached_property
    def hook(self) -> KineticHook:
        return KineticHook(self.kinetic_conn_id)

    # ---- execute -------------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        self.published_links = {}  # none yet: a failure before the batch has none
        rendered_as("inputs", self.inputs, list | tuple, "a list or tuple of inputs")
        if not self.inputs:  # as Airflow skips an expand() over []: succeed with nothing
            self.log.info("kinetic: no inputs (an empty list): nothing to run; the value is []")
            return []
        batch = self._try = BatchTry.open(self, context)
        planned = batch.plan()  # a bad input fails here
        batch.resume_or_start(planned)
        self._store = batch.store
        if not self.wait_for_completion:  # a KineticBatchSensor waits for it
            return batch.submit_only()
        self.published_links = {KineticBatchLink.key: batch.publish()}
        if batch.collecting:  # delivered by a try that ended before returning the values
            return batch_finish.finish(batch)
        if self.deferrable:
            batch_wait.wait_deferred(batch)  # defers, unless every child ends first
        else:
            batch_wait.wait_sync(batch)
        return batch_finish.finish(batch)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume: re-read the real status of active children, then continue."""
        if not event or not event.get("state"):
            raise AirflowException(f"kinetic batch resumed without its state (event {event!r})")
        state = BatchState.from_dict(event["state"])
        self.hook.resumed = True  # the try's first segment warned of a local fallback
        batch = self._try = BatchTry.reopen(self, context, state)
        self._store = batch.store
        batch_wait.resumed(batch, event)
        if self.deferrable:
            batch_wait.wait_deferred(batch)
        else:
            batch_wait.wait_sync(batch)
        return batch_finish.finish(batch)

    def on_kill(self) -> None:
        """Cancel every child this try has running."""
        if self._try is not None:
            batch_wait.cancel(self._try)

    def dry_run(self) -> dict[str, Any]:
        """The manifest of the batch's first child, printed as YAML; creates nothing."""
        batch = BatchTry.dry(self)
        state = batch.plan().state
        spec = batchlaunch.child_spec(
            state, 0, "job-dryrun00", batch.config, batch.store, batch.secret
        )
        manifest = backend_class(state.backend).manifest(spec)
        assert batch.image_plan is not None
        print("\n".join(self.image_report(batch.image_plan, batch.config)))
        print(to_yaml(manifest))
        return manifest
