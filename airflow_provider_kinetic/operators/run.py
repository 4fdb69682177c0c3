"""KineticRunOperator: run one Python callable as a kinetic job and return its value.

The operator translates Airflow concepts (templates, XCom, defer, retries, kill)
into ``core`` calls and holds no protocol logic of its own.  This module holds its
arguments, ``execute`` (one try: submit or adopt, wait, finish), the sync and the
deferred wait side by side, and ``execute_complete``; the try's steps are
``operators.task_try.TaskTry``'s methods.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cached_property
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.catalog.capacity import DEFAULT_CAPACITY_WAIT_S
from airflow_provider_kinetic.core.jobs.checkpoint import DEFAULT_SYNC_S, RESTORE_SAME_WORK
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY
from airflow_provider_kinetic.core.jobs.retry_on import is_template, parse_retry_on
from airflow_provider_kinetic.core.jobs.taskrecord import Step, request_cancel
from airflow_provider_kinetic.core.keys.publish import NEWEST_LOGICAL_DATE, check_policy
from airflow_provider_kinetic.core.spec.debug import DEFAULT_DEBUG_PORT, DEFAULT_DEBUG_WAIT_S
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.links import KineticJobLink, KineticLogsLink, KineticOutputLink
from airflow_provider_kinetic.operators import assets, dry_run, end_task, job_wait, keyio, reuse
from airflow_provider_kinetic.operators import debug as debug_mode
from airflow_provider_kinetic.operators.capacity import CAPACITY_TEMPLATE_FIELDS
from airflow_provider_kinetic.operators.common import (
    DEFAULT_DEFERRABLE,
    KineticOperatorBase,
    deadline,
    defer_grace_s,
    defer_timeout,
    rendered_as,
)
from airflow_provider_kinetic.operators.task_try import TaskTry
from airflow_provider_kinetic.triggers.job import KineticJobTrigger


class KineticRunOperator(KineticOperatorBase):
    """Run ``python_callable(*op_args, **op_kwargs)`` on a kinetic backend.

    The callable and its arguments are cloudpickled (DAG-file code by value), any
    ``Data`` in the arguments or ``volumes`` is content-hashed and uploaded once, and
    the function's return value becomes this task's ``return_value`` XCom.  XCom
    ``kinetic_job`` (the JobHandle dict) and ``output_dir`` are pushed before waiting.

    Every try first looks for the task's job from an earlier try (``core.jobs.taskrecord``):
    a running job is adopted, a finished one collected, so a job is never run twice.
    A result that does not fit XCom (not serializable by Airflow, or larger than
    ``[kinetic] max_xcom_result_bytes``) becomes a reference (``load_result``).

    :param python_callable: the function to run remotely.
    :param op_args: its positional arguments (templated; ``Data`` may sit at any depth).
    :param op_kwargs: its keyword arguments (templated; must render to a dict).
    :param preemption_retries: re-submits of a preempted job (spot reclaim, node shutdown)
        within the try, not using Airflow ``retries`` (default 2): ``retry_on``'s preemption.
    :param retry_on: re-submits per failure class within one try (templated):
        ``{"preemption": 3, "infra": 1, "user_error": 0}``, ``{"exit_codes": [42]}``
        (these count as infra) or ``"never"``; docs/RETRIES.md.  A job that fails for
        good raises its class's exception (``KineticUserError``, ``KineticInfraError``, ...).
    :param wait_for_completion: ``False`` submits, pushes the handle and succeeds at once
        (its return value is the handle dict); a ``KineticJobSensor`` with
        ``return_result=True`` waits for it later.
    :param output_asset: a successful job emits an asset event for its output dir
        through the alias ``kinetic:{dag_id}/{task_id}`` (added to ``outlets``), or,
        when ``outlets`` are given, attaches its extra (job id, accelerator, capacity, a
        small JSON value) to theirs (``operators.assets``); ``Data`` of an asset becomes
        an inlet.  ``False``: none of this.
    :param output_key: a key (``"models/churn"``, templated) the output dir becomes the
        new version of when the job succeeds (never on failure; a retry that collects
        the same content makes no second version); the version's row is XCom
        ``kinetic_output_key``, and a new version is an asset event for
        ``kinetic://KEY``.  ``Data("kinetic://KEY")`` reads a key (pinned per DAG run:
        XCom ``kinetic_keys``).
    :param accelerator: ``"cpu"``, ``"gpu-l4"``, ``"tpu-v6e-2x4:spot"``, ... (templated).
    :param num_slices: N multi-host TPU slices of ``accelerator`` as one JobSet (templated).
    :param volumes: ``{"/abs/mount/path": Data(...)}`` (templated).
    :param output_dir: URI exported as ``KINETIC_OUTPUT_DIR`` (templated); default is
        deterministic per (dag_id, run_id, task_id, map_index) under ``outputs/``.
    :param capture_env_vars: env var names / ``PREFIX*`` patterns to forward (their
        values travel as secrets and are masked; templated).
    :param kinetic_conn_id: a ``kinetic`` connection; absent default = local backend.
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param poll_interval: seconds between status reads.
    :param cpu: CPU request for cpu jobs on GKE (e.g. ``"4"``).
    :param memory: memory request for cpu jobs on GKE (e.g. ``"16Gi"``).
    :param spot: run on spot VMs (the same as a ``:spot`` suffix on ``accelerator``).
    :param cleanup: what an ended job leaves (``core.jobs.cleanup``): ``"on_success"``
        (default) deletes the job's artifacts once its value is delivered and keeps a
        failed job's for ``[kinetic] failed_retention_days``; ``"always"`` deletes them
        however it ended; ``"never"`` keeps them for ``jobs cleanup``.
    :param context_excludes: extra glob patterns (``.kineticignore`` syntax) left out of
        the job context, the zip of the DAG file's project directory.
    :param container_image: the image cluster jobs run in: ``"bundled"`` (built once
        from the requirements), ``"prebuilt"`` (requirements installed at pod start) or
        an image URI; default: the connection's.  The local backend ignores it.
    :param requirements: requirement strings or a path to a requirements file /
        ``pyproject.toml`` (templated); ``[]`` for none; unset: the nearest
        ``requirements.txt`` (else ``pyproject.toml``) up from the DAG file.
    :param capacity: how the pods get accelerators on GKE (``core.capacity``):
        ``"on-demand"``, ``"spot"``, ``"flex-start"``, ``"reservation:NAME"``,
        ``"queue:NAME"``, ``"class:NAME"``, or a list tried in order (templated).
    :param capacity_wait: per capacity step, how long its pods may stay unschedulable
        before the next step is tried (seconds, ``"15m"`` or a ``timedelta``; default 15
        min; templated).
    :param priority_class: Kueue ``WorkloadPriorityClass`` of ``queue:`` steps (templated).
    :param max_run_duration: flex-start: the job's deadline; ``queue:`` steps: Kueue's
        max run duration (at most 7 days; templated).
    :param checkpoint_sync_s: seconds between saves of ``KINETIC_CHECKPOINT_DIR`` while
        the function runs (also saved on SIGTERM and at exit).
    :param checkpoint_restore: ``"same_work"`` (default): restore only a checkpoint this
        same work wrote (the same code, arguments, Data and options); ``"any"``: the task
        run's last checkpoint, whatever work wrote it (a fix that should continue from
        the old files). Logged either way.
    :param output_key_policy: ``"newest_logical_date"`` (default): a run of an older
        logical date does not move ``output_key`` (its version is stored, listed and kept
        aside, and the log says so); ``"last_finisher"``: the last run to finish wins.
    :param cache: ``True`` returns a delivered result of the same work (code, arguments,
        Data contents, options) and its output dir without a job (XCom ``kinetic_cache``
        says hit or miss, and which job and run made it); concurrent identical tasks run
        one job; failed jobs are never cached (README "Caching").  Off by default.
    :param cache_version: a string in the cache key: change it to stop reusing results.
    :param cache_ignore: argument names whose values do not count (``["seed"]``).
    :param debug: run the function under a debugpy server that waits for a debugger
        (VS Code) before calling it; the task log says how to attach (``airflow kinetic
        jobs debug JOB``; README "Debugging").  The job's runtime needs ``debugpy``.
    :param debug_port: the port debugpy listens on, loopback only (default 5678).
    :param debug_wait: how long the job waits for a debugger before it fails (seconds
        or a ``timedelta``; default 30 min).  ``execution_timeout`` still applies.

    :raises KineticJobFailed: the job failed (the remote exception is its ``__cause__``).
    :raises KineticJobCancelled: the job was cancelled (execution_timeout, trigger errors).
    """

    template_fields: Sequence[str] = (
        "op_args",
        "op_kwargs",
        "retry_on",
        "volumes",
        "output_dir",
        "accelerator",
        "capture_env_vars",
        "requirements",
        "output_key",
        "num_slices",
        *CAPACITY_TEMPLATE_FIELDS,
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    ui_color = "#e8f0fe"
    operator_extra_links = (KineticJobLink(), KineticLogsLink(), KineticOutputLink())
    #: Trigger errors while the job still runs that re-defer before the job is cancelled.
    MAX_REDEFER_ATTEMPTS = 3
    #: Link key -> URL pushed in this segment (``links._XComLink``); None in a resumed one.
    published_links: dict[str, str] | None = None

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        preemption_retries: int | None = None,
        retry_on: dict[str, Any] | str | None = None,
        wait_for_completion: bool = True,
        output_asset: bool = True,
        output_key: str | None = None,
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
        output_key_policy: str = NEWEST_LOGICAL_DATE,
        cache: bool = False,
        cache_version: str | None = None,
        cache_ignore: list[str] | None = None,
        debug: bool = False,
        debug_port: int = DEFAULT_DEBUG_PORT,
        debug_wait: Any = DEFAULT_DEBUG_WAIT_S,
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
            checkpoint_restore=checkpoint_restore,
            **kwargs,
        )
        self.set_slices(num_slices)  # fails at parse time, as the rest
        self.output_asset = output_asset
        self.output_key_policy = check_policy(output_key_policy)
        self.output_key = keyio.check_output_key(output_key, self.task_id, rendered=False)
        self.python_callable = self.require_callable(python_callable)
        self.op_args = op_args
        self.op_kwargs = op_kwargs
        self.preemption_retries = preemption_retries
        self.retry_on = retry_on
        if not is_template(retry_on):  # bad input fails at parse time
            parse_retry_on(retry_on, preemption_retries=preemption_retries)
        self.wait_for_completion = wait_for_completion
        self.cache_settings = reuse.check(self, cache, cache_version, cache_ignore)
        self.debug_settings = debug_mode.check(self, debug, debug_port, debug_wait)
        self._try: TaskTry | None = None  # this execution segment's try
        assets.setup(
            self,
            user_outlets=bool(kwargs.get("outlets")),
            argument_fields=("op_args", "op_kwargs", "volumes"),
        )

    def request_args(self) -> tuple[Any, ...]:
        rendered_as("op_args", self.op_args, list | tuple, "a list or tuple")
        return tuple(self.op_args or ())

    @cached_property
    def hook(self) -> KineticHook:
        return KineticHook(self.kinetic_conn_id)

    @property
    def _store(self) -> ObjectStore | None:
        """The store this segment's try uses (the lineage reads the task's record there)."""
        return self._try.store if self._try is not None else None

    # ---- execute ----------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        self.published_links = {}  # none yet: a failure before the job exists has none
        run = self._try = TaskTry.open(self, context)
        keyio.check_output_key(self.output_key, self.task_id, rendered=True)
        planned = run.plan()  # bad input fails here, before anything
        earlier = run.look_back(planned)
        if not self.wait_for_completion:
            return run.submit_only(earlier, planned)
        if earlier.step is Step.COLLECT:
            assert earlier.job is not None and earlier.report is not None
            run.publish(earlier.job)
            return run.finish(earlier.job, earlier.report, 0)
        hit, value = reuse.look_up(run, planned, earlier.step)  # cache=True
        if hit:
            return value
        with reuse.unclaimed_on_error(run):  # waiting identical tasks run their own job
            handle = run.start(earlier, planned)
            debug_mode.announce(self, handle)
            deadline_ts = deadline(context, self.execution_timeout)
            if self.deferrable:
                return self._wait_deferred(run, handle, deadline_ts)
            return self._wait_sync(run, handle, deadline_ts)

    def _wait_sync(self, run: TaskTry, handle: JobHandle, deadline_ts: float | None) -> Any:
        """Poll in the worker, the job's log shown live, until it ends; finish it."""
        watched = job_wait.wait(run, handle, deadline_ts)
        assert watched.report is not None
        return run.finish(watched.handle, watched.report, watched.offset)

    def _wait_deferred(self, run: TaskTry, handle: JobHandle, deadline_ts: float | None) -> Any:
        """Hand the job to the triggerer (``execute_complete`` resumes, unless the trigger
        ends the task: ``operators.end_task``); a job that ends within ``defer_grace_s``
        is finished here: deferring costs a round trip and the settle hold."""
        grace = defer_grace_s() if run.backend.first_poll_s is not None else 0.0
        watched = job_wait.wait(run, handle, deadline_ts, give_up_after=grace)
        if watched.report is None:
            self._defer(run, watched.handle, deadline_ts, attempt=0, log_offset=watched.offset)
        return run.finish(watched.handle, watched.report, watched.offset)

    def _defer(
        self,
        run: TaskTry,
        handle: JobHandle,
        deadline_ts: float | None,
        attempt: int,
        log_offset: int = 0,
    ) -> NoReturn:
        run.deferring(handle)  # the record says DEFERRED from here on, not before
        self.defer(
            trigger=KineticJobTrigger(
                handle=handle.to_dict(),
                config=config_to_json(run.config),
                poll_interval=self.poll_interval,
                deadline=deadline_ts,
                attempt=attempt,
                log_offset=log_offset,
                end_task=end_task.decide(self, run.identity),
            ),
            method_name="execute_complete",
            timeout=defer_timeout(deadline_ts, self.poll_interval),
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger: the job's final state from its event (re-read only
        when the event has none), the rest of its log, finish.

        A trigger *error* while the job still runs re-defers (up to ``MAX_REDEFER_ATTEMPTS``);
        a timeout, or errors beyond that, cancel the job.  A job taken over is waited for.
        """
        if not event or "handle" not in event:
            raise AirflowException(f"kinetic trigger returned no usable event: {event!r}")
        self.hook.resumed = True  # the try's first segment warned of a local fallback
        backend_kind = JobHandle.from_dict(event["handle"]).backend
        run = self._try = TaskTry.open(self, context, backend_kind)
        then = job_wait.resumed(run, event, self.MAX_REDEFER_ATTEMPTS)
        if then.report is None:
            return self._defer(run, then.handle, then.deadline, then.attempt, then.offset)
        return run.finish(then.handle, then.report, then.offset)

    def dry_run(self) -> dict[str, Any]:
        """The manifest this operator would submit, printed as YAML; creates nothing
        (``operators.dry_run``)."""
        return dry_run.dry_run(self)

    def on_kill(self) -> None:
        """Cancel the job this try started (and only while it is unfinished)."""
        run = self._try
        if run is not None and run.handle is not None:
            self.log.info("task killed: cancelling kinetic job %s", run.handle.job_id)
            request_cancel(run.store, run.backend, run.handle)
        if run is not None:
            reuse.unclaim(run)
