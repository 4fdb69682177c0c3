"""KineticRunOperator: run one Python callable as a kinetic job and return its value.

The operator translates Airflow concepts (templates, XCom, defer, retries, kill)
into ``core`` calls and holds no protocol logic of its own.  This module holds its
arguments and ``execute`` (which decides, per try, whether to submit, adopt or
collect); the rest lives in its bases, one concern each:

* ``run_tries``: submitting, publishing and recording a try's job, preemption;
* ``run_sync``: waiting in the worker (polling, the live log) and finishing;
* ``run_deferred``: deferring to the triggerer and ``execute_complete``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.k8s.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.catalog.capacity import DEFAULT_CAPACITY_WAIT_S
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.checkpoint import DEFAULT_SYNC_S
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY, after_job
from airflow_provider_kinetic.core.jobs.fallback import describe_step
from airflow_provider_kinetic.core.jobs.submit import PlannedJob, plan_job
from airflow_provider_kinetic.core.jobs.taskrecord import (
    Step,
    decide_job,
    request_cancel,
    supersede_record,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.links import KineticJobLink, KineticLogsLink, KineticOutputLink
from airflow_provider_kinetic.operators import assets, keyio
from airflow_provider_kinetic.operators.capacity import CAPACITY_TEMPLATE_FIELDS
from airflow_provider_kinetic.operators.common import (
    DEFAULT_DEFERRABLE,
    deadline,
    defer_grace_s,
    directory_uri,
    rendered_as,
    task_identity,
)
from airflow_provider_kinetic.operators.run_deferred import RunDeferredWait


class KineticRunOperator(RunDeferredWait):
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
    :param preemption_retries: how often a job killed by the platform (spot reclaim,
        eviction) is submitted again within the same try; these do not use the task's
        Airflow ``retries``.
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
    :param accelerator: ``"cpu"``, ``"cpu:8"``, ``"gpu-l4"``, ``"tpu-v5e-4"``,
        ``"tpu-v6e-2x4"``, ... with an optional ``":spot"`` (templated).
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

    :raises KineticJobFailed: the job failed (the remote exception is its ``__cause__``).
    :raises KineticJobCancelled: the job was cancelled (execution_timeout, trigger errors).
    """

    template_fields: Sequence[str] = (
        "op_args",
        "op_kwargs",
        "volumes",
        "output_dir",
        "accelerator",
        "capture_env_vars",
        "requirements",
        "output_key",
        *CAPACITY_TEMPLATE_FIELDS,
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    ui_color = "#e8f0fe"
    operator_extra_links = (KineticJobLink(), KineticLogsLink(), KineticOutputLink())

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        preemption_retries: int = 2,
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
        self.output_asset = output_asset
        self.output_key = keyio.check_output_key(output_key, self.task_id, rendered=False)
        self.python_callable = self.require_callable(python_callable)
        self.op_args = op_args
        self.op_kwargs = op_kwargs
        self.preemption_retries = preemption_retries
        self.wait_for_completion = wait_for_completion
        self._handle: JobHandle | None = None
        self._backend: Backend | None = None
        self._store: ObjectStore | None = None
        assets.setup(
            self,
            user_outlets=bool(kwargs.get("outlets")),
            argument_fields=("op_args", "op_kwargs", "volumes"),
        )

    def request_args(self) -> tuple[Any, ...]:
        rendered_as("op_args", self.op_args, list | tuple, "a list or tuple")
        return tuple(self.op_args or ())

    # ---- execute ----------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        self.published_links = {}  # none yet: a failure before the job exists has none
        hook = KineticHook(self.kinetic_conn_id)
        config = hook.get_config()
        store = hook.get_store()
        backend = hook.get_backend(config.backend_kind(self.accelerator_spec()))
        self._backend, self._store = backend, store
        keyio.check_output_key(self.output_key, self.task_id, rendered=True)
        planned = self._plan(context, config, store)  # bad input fails here, before anything
        if self.output_asset and planned.handle.output_dir:  # rendered or default: pre-job
            assets.asset_uri(planned.handle.output_dir, f"task {self.task_id!r}: output dir")
        record = self._read_record(context, store)
        step, old, report, why = decide_job(record, backend, store, result_key, planned.work)
        if record is not None:
            self.log.info("kinetic: earlier try found: %s -> %s", why, step.value)
            if step is Step.SUBMIT and old is not None:  # keep the old record for history
                supersede_record(store, task_identity(context), record, deployment_secret())
                # Cancelled or ended, and never collected: the failure rule of the policy.
                after_job(store, backend, [old], succeeded=False, mode=self.cleanup, log_=self.log)
        if not self.wait_for_completion:
            return self._submit_only(context, config, backend, store, step, old, planned)
        if step is Step.COLLECT:
            assert old is not None and report is not None
            self._publish(context, old)
            return self._finish(context, store, backend, old, report, 0)
        if step is Step.ADOPT:
            assert old is not None
            self.log.info("adopting still-%s kinetic job %s", report.status.value, old.job_id)
            handle = old
        else:
            handle = self._submit(context, config, backend, store, planned)
        self._write_record(context, store, handle, preemptions=self._preemptions(record))
        self._publish(context, handle)
        deadline_ts = deadline(context, self.execution_timeout)
        while True:
            # Deferrable: a job that ends within a moment (local backend) is collected
            # here; deferring it would make Airflow race the worker's own exit report
            # against the trigger's event (apache/airflow#66374) and costs a round trip.
            grace = defer_grace_s() if backend.first_poll_s is not None else 0.0
            give_up = time.monotonic() + grace if self.deferrable else None
            report, offset = self._wait(backend, handle, deadline_ts, give_up)
            if report is None:
                return self._defer(config, handle, deadline_ts, attempt=0, log_offset=offset)
            fallback = self._next_capacity(context, config, backend, store, handle, report)
            if fallback is not None:
                handle = fallback
                continue
            if not self._preempted(context, store, handle, report):
                return self._finish(context, store, backend, handle, report, offset)
            handle = self._resubmit_preempted(context, config, backend, store, handle, report)

    def _finish(
        self,
        context: Any,
        store: ObjectStore,
        backend: Backend,
        handle: JobHandle,
        report: StatusReport,
        offset: int,
    ) -> Any:
        """Collect (``run_sync``), then the output dir's asset event: on every path
        that delivers a value (this worker, a resumed deferral, a later try)."""
        value = super()._finish(context, store, backend, handle, report, offset)
        keyio.put_output_key(self, context, store, handle)  # succeeded: super() raised else
        if handle.output_dir:
            out = directory_uri(handle.output_dir) or handle.output_dir
            assets.emit(self, context, out, assets.job_extra(handle, value, out))
        return value

    def _submit_only(
        self,
        context: Any,
        config: KineticConfig,
        backend: Backend,
        store: ObjectStore,
        step: Step,
        old: JobHandle | None,
        planned: PlannedJob,
    ) -> dict[str, Any]:
        """Submit now, wait later: the handle is the task's value.  A retry after a
        worker died returns the job it had submitted; a clear submits a new one."""
        handle = old if step is not Step.SUBMIT and old is not None else None
        if handle is None:
            handle = self._submit(context, config, backend, store, planned)
        self._publish(context, handle)
        self._write_record(context, store, handle, delivered=True)
        self._handle = None  # nobody waits here: on_kill must not cancel it
        return handle.to_dict()

    def dry_run(self) -> dict[str, Any]:
        """The manifest this operator would submit, printed as YAML; creates nothing.

        Packs the payload (so its SHA-256 is real) and hashes local Data, but uploads
        nothing and needs no cluster credentials.  Templates are used as they stand.
        Secrets (the result key) appear as references, never as values.
        """
        config = KineticHook(self.kinetic_conn_id).get_config()
        store = config.store()  # a dry run needs no credentials
        identity = {"dag_id": self.dag_id, "task_id": self.task_id, "run_id": "dry_run"}
        request = self.build_request(identity, store.uri)
        image = self.resolve_image(request, config, store, build=False)
        planned = plan_job(request, config, store, "job-dryrun00", deployment_secret())
        manifest = backend_class(planned.template.backend).manifest(planned.spec)
        print("\n".join(self.image_report(image, config)))
        chain = planned.template.capacity
        for step in range(len(chain)):  # a fallback chain: what each step would send
            job = (
                planned
                if step == 0
                else plan_job(
                    request, config, store, f"job-dryrun{step:02d}", deployment_secret(), step
                )
            )
            if len(chain) > 1:
                print(("---\n" if step else "") + f"# capacity: {describe_step(chain, step)}")
            print(to_yaml(backend_class(job.template.backend).manifest(job.spec)))
        return manifest

    def on_kill(self) -> None:
        """Cancel the job this try started (and only while it is unfinished)."""
        if self._handle is not None and self._backend is not None:
            self.log.info("task killed: cancelling kinetic job %s", self._handle.job_id)
            request_cancel(self._store, self._backend, self._handle)
