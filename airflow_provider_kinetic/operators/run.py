"""KineticRunOperator: run one Python callable as a kinetic job and return its value.

The operator translates Airflow concepts (templates, XCom, defer, retries, kill)
into ``core`` calls and holds no protocol logic of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.jobs.results import collect_with_blob, is_preemption
from airflow_provider_kinetic.core.jobs.submit import plan_job, submit_job
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    Step,
    TaskRecord,
    decide_job,
    read_record,
    request_cancel,
    write_record,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport, new_job_id
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.exceptions import KineticJobCancelled, KineticJobFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.hooks.signing import deployment_secret, result_key
from airflow_provider_kinetic.links import (
    KineticJobLink,
    KineticLogsLink,
    KineticOutputLink,
    job_links,
)
from airflow_provider_kinetic.operators.common import (
    XCOM_JOB,
    XCOM_OUTPUT_DIR,
    KineticOperatorBase,
    deadline,
    defer_grace_s,
    defer_timeout,
    delete_artifacts,
    directory_uri,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.triggers.job import KineticJobTrigger


class KineticRunOperator(KineticOperatorBase):
    """Run ``python_callable(*op_args, **op_kwargs)`` on a kinetic backend.

    The callable and its arguments are cloudpickled (DAG-file code by value), any
    ``Data`` in the arguments or ``volumes`` is content-hashed and uploaded once, and
    the function's return value becomes this task's ``return_value`` XCom.  XCom
    ``kinetic_job`` (the JobHandle dict) and ``output_dir`` are pushed before waiting.

    Args:
        python_callable: the function to run remotely.
        op_args / op_kwargs: its arguments (templated; ``Data`` may sit at any depth).
        accelerator: ``"cpu"``, ``"gpu-l4"``, ``"tpu-v5e-4"``, ``"tpu-v6e-2x4"``, ...
        spot: run on spot VMs (the same as a ``:spot`` suffix on ``accelerator``).
        volumes: ``{"/abs/mount/path": Data(...)}`` (templated).
        output_dir: URI exported as ``KINETIC_OUTPUT_DIR`` (templated); default is
            deterministic per (dag_id, run_id, task_id, map_index) under ``outputs/``.
        capture_env_vars: env var names / ``PREFIX*`` patterns to forward.
        kinetic_conn_id: a ``kinetic`` connection; absent default = local backend.
        deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
        poll_interval: seconds between status reads.
        cpu / memory: resource requests for cpu jobs on GKE.
        preemption_retries: how often a job killed by the platform (spot reclaim,
            eviction) is submitted again within the same try; these do not use the
            task's Airflow ``retries``.
        wait_for_completion: ``False`` submits, pushes the handle and succeeds at once
            (its return value is the handle dict); a ``KineticJobSensor`` with
            ``return_result=True`` waits for it later.

    Every try first looks for the task's job from an earlier try (``core.taskrecord``):
    a running job is adopted, a finished one collected, so a job is never run twice.
    A result that does not fit XCom (not serializable by Airflow, or larger than
    ``[kinetic] max_xcom_result_bytes``) becomes a reference (``load_result``).

    Raises:
        KineticJobFailed: the job failed (the remote exception is its ``__cause__``).
        KineticJobCancelled: the job was cancelled (execution_timeout, trigger errors).
    """

    template_fields: Sequence[str] = (
        "op_args",
        "op_kwargs",
        "volumes",
        "output_dir",
        "accelerator",
        "capture_env_vars",
        "requirements",
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    ui_color = "#e8f0fe"
    operator_extra_links = (KineticJobLink(), KineticLogsLink(), KineticOutputLink())
    MAX_REDEFER_ATTEMPTS = 3

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        preemption_retries: int = 2,
        wait_for_completion: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.python_callable = self.require_callable(python_callable)
        self.op_args = op_args
        self.op_kwargs = op_kwargs
        self.preemption_retries = preemption_retries
        self.wait_for_completion = wait_for_completion
        self._handle: JobHandle | None = None
        self._backend: Backend | None = None
        self._store: ObjectStore | None = None

    def request_args(self) -> tuple[Any, ...]:
        return tuple(self.op_args or ())

    # ---- execute ----------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        hook = KineticHook(self.kinetic_conn_id)
        config = hook.get_config()
        store = hook.get_store()
        backend = hook.get_backend(config.backend_kind(self.parsed_accelerator()))
        self._backend, self._store = backend, store
        record = self._read_record(context, store)
        step, old, report, why = decide_job(record, backend, store, result_key)
        if record is not None:
            self.log.info("kinetic: earlier try found: %s -> %s", why, step.value)
        if not self.wait_for_completion:
            return self._submit_only(context, config, backend, store, step, old)
        if step is Step.COLLECT:
            assert old is not None and report is not None
            self._publish(context, old)
            return self._finish(context, store, backend, old, report, 0)
        if step is Step.ADOPT:
            assert old is not None
            self.log.info("adopting still-%s kinetic job %s", report.status.value, old.job_id)
            handle = old
        else:
            handle = self._submit(context, config, backend, store)
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
            if not self._preempted(context, store, handle, report):
                return self._finish(context, store, backend, handle, report, offset)
            handle = self._resubmit_preempted(context, config, backend, store, handle, report)

    def _submit_only(
        self,
        context: Any,
        config: KineticConfig,
        backend: Backend,
        store: ObjectStore,
        step: Step,
        old: JobHandle | None,
    ) -> dict[str, Any]:
        """Submit now, wait later: the handle is the task's value.  A retry after a
        worker died returns the job it had submitted; a clear submits a new one."""
        handle = old if step is not Step.SUBMIT and old is not None else None
        if handle is None:
            handle = self._submit(context, config, backend, store)
        self._publish(context, handle)
        self._write_record(context, store, handle, delivered=True)
        self._handle = None  # nobody waits here: on_kill must not cancel it
        return handle.to_dict()

    def _submit(
        self, context: Any, config: KineticConfig, backend: Backend, store: ObjectStore
    ) -> JobHandle:
        """Submit a new job, recording its id *before* it is created: a worker that dies
        in between leaves a record a retry can follow (and never a second job)."""
        request = self.build_request(task_identity(context), store.uri, context)
        self.resolve_image(request, config, store, build=True)  # before any upload
        request.job_id = new_job_id()
        provisional = JobHandle(
            job_id=request.job_id,
            backend=backend.name,
            bucket_name=store.bucket,
            namespace=config.namespace,
            k8s_name=backend.object_name(request.job_id),
        )
        self._write_record(context, store, provisional)
        handle, _ = submit_job(request, config, backend, store, deployment_secret())
        return handle

    def _publish(self, context: Any, handle: JobHandle) -> None:
        """XComs a person or a downstream task needs while the job runs."""
        self._handle = handle
        ti = context["ti"]
        ti.xcom_push(key=XCOM_JOB, value=handle.to_dict())
        ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(handle.output_dir))
        for key, url in job_links(handle, self.kinetic_conn_id).items():
            ti.xcom_push(key=key, value=url)
        self.log.info("kinetic job %s: output dir %s", handle.job_id, handle.output_dir)

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
        """Resume after the trigger: re-read real state, show the job's log, collect.

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
        print(to_yaml(manifest))
        return manifest

    # ---- waiting / finishing ------------------------------------------------------
    def _wait(
        self,
        backend: Backend,
        handle: JobHandle,
        deadline: float | None,
        give_up: float | None = None,
    ) -> tuple[StatusReport | None, int]:
        """Poll until the job ends (its report) or, with ``give_up`` (a monotonic
        time), until then (``None``: the caller defers); the log offset shown so far."""
        offset, last = 0, None
        delays = poll_delays(self.poll_interval, backend.first_poll_s)
        while True:
            report = backend.status(handle)
            offset = self._show_logs(backend, handle, offset)
            if report.describe() != last:
                self.log.info("kinetic job %s: %s", handle.job_id, report.describe())
                last = report.describe()
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
            raise KineticJobFailed(
                f"kinetic job {handle.job_id} failed: {type(exc).__name__}: {exc}",
                job_id=handle.job_id,
            ) from exc
        finally:
            self._handle = None  # done: on_kill must not touch a finished job
            # Collected (value or error): the Job / LeaderWorkerSet goes now, whatever the
            # outcome (a LeaderWorkerSet has no TTL; a failed job may hold a stuck pod).
            try:
                backend.cancel(handle)
            except Exception as exc:  # noqa: BLE001 - keep the job's own outcome
                self.log.warning("could not delete job %s: %s", handle.job_id, exc)
        delivered = xcom_value(value, store, handle.job_id, blob, self.log)
        self._write_record(context, store, handle, delivered=True)
        if self.cleanup == "artifacts":
            delete_artifacts(store, [handle.job_id], delivered, self.log)
        return delivered

    # ---- tries, preemption, kill --------------------------------------------------
    def _read_record(self, context: Any, store: ObjectStore) -> TaskRecord | None:
        """The task's record in the store; Airflow 3.3's task state store as a fallback."""
        record = read_record(store, task_identity(context), deployment_secret())
        if record is not None:
            return record
        state = context.get("task_state_store")
        try:
            previous = state.get(XCOM_JOB) if state is not None else None
        except Exception:  # noqa: BLE001 - an unreadable state store means "nothing found"
            previous = None
        if isinstance(previous, dict) and previous.get("job_id"):
            return TaskRecord(kind="job", mode=SYNC, handle=previous)
        return None

    def _write_record(
        self,
        context: Any,
        store: ObjectStore,
        handle: JobHandle,
        *,
        delivered: bool = False,
        preemptions: int | None = None,
    ) -> None:
        identity = task_identity(context)
        secret = deployment_secret()
        if preemptions is None:
            old = read_record(store, identity, secret)
            preemptions = self._preemptions(old)
        record = TaskRecord(
            kind="job",
            mode=DEFERRED if self.deferrable else SYNC,
            try_number=identity.get("try_number"),
            handle=handle.to_dict(),
            delivered=delivered,
            preemptions=preemptions,
        )
        write_record(store, identity, record, secret)
        state = context.get("task_state_store")
        if state is not None and not delivered:
            try:
                state.set(XCOM_JOB, handle.to_dict())
            except Exception as exc:  # noqa: BLE001 - the store record is what counts
                self.log.warning("could not record the job in the task state store: %s", exc)

    @staticmethod
    def _preemptions(record: TaskRecord | None) -> int:
        return record.preemptions if record is not None and record.kind == "job" else 0

    def _preempted(
        self, context: Any, store: ObjectStore, handle: JobHandle, report: StatusReport
    ) -> bool:
        """A platform kill (spot reclaim, eviction) with budget left for this task."""
        if not is_preemption(report, store, handle):
            return False
        used = self._preemptions(read_record(store, task_identity(context), deployment_secret()))
        if used >= self.preemption_retries:
            self.log.warning(
                "kinetic job %s was preempted (%s) and the task's %d preemption retries are "
                "used up",
                handle.job_id,
                report.describe(),
                self.preemption_retries,
            )
            return False
        return True

    def _resubmit_preempted(
        self,
        context: Any,
        config: KineticConfig,
        backend: Backend,
        store: ObjectStore,
        handle: JobHandle,
        report: StatusReport,
    ) -> JobHandle:
        used = self._preemptions(read_record(store, task_identity(context), deployment_secret()))
        self.log.warning(
            "kinetic job %s was preempted (%s): submitting it again (preemption retry %d/%d; "
            "the task's Airflow retries are not used)",
            handle.job_id,
            report.describe(),
            used + 1,
            self.preemption_retries,
        )
        backend.cancel(handle)  # delete what is left of it
        new = self._submit(context, config, backend, store)
        self._write_record(context, store, new, preemptions=used + 1)
        self._publish(context, new)
        return new

    def on_kill(self) -> None:
        """Cancel the job this try started (and only while it is unfinished)."""
        if self._handle is not None and self._backend is not None:
            self.log.info("task killed: cancelling kinetic job %s", self._handle.job_id)
            request_cancel(self._store, self._backend, self._handle)
