"""KineticRunOperator: run one Python callable as a kinetic job and return its value.

The operator translates Airflow concepts (templates, XCom, defer, retries, kill)
into ``core`` calls and holds no protocol logic of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.backends.base import Backend, StatusReport
from airflow_provider_kinetic.core.backends.manifests import to_yaml
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.results import collect
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.submit import plan_job, submit_job
from airflow_provider_kinetic.exceptions import KineticJobCancelled, KineticJobFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.links import KineticJobLink, job_url
from airflow_provider_kinetic.operators.common import (
    XCOM_JOB,
    XCOM_OUTPUT_DIR,
    KineticOperatorBase,
    deadline,
    defer_timeout,
    directory_uri,
    task_identity,
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
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    ui_color = "#e8f0fe"
    operator_extra_links = (KineticJobLink(),)
    MAX_REDEFER_ATTEMPTS = 3

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.python_callable = self.require_callable(python_callable)
        self.op_args = op_args
        self.op_kwargs = op_kwargs
        self._handle: JobHandle | None = None
        self._backend: Backend | None = None

    def request_args(self) -> tuple[Any, ...]:
        return tuple(self.op_args or ())

    # ---- execute ----------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        hook = KineticHook(self.kinetic_conn_id)
        config = hook.get_config()
        store = config.store()
        backend = hook.get_backend(config.backend_kind(self.parsed_accelerator()))
        self._backend = backend
        handle = self._adopt(context, backend)
        if handle is None:
            request = self.build_request(task_identity(context), store.uri, context)
            handle, _ = submit_job(request, config, backend, store)
            self._remember(context, handle)
        self._handle = handle
        ti = context["ti"]
        ti.xcom_push(key=XCOM_JOB, value=handle.to_dict())
        ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(handle.output_dir))
        ti.xcom_push(key=KineticJobLink().xcom_key, value=job_url(handle))
        self.log.info("kinetic job %s: output dir %s", handle.job_id, handle.output_dir)
        deadline_ts = deadline(context, self.execution_timeout)
        if self.deferrable:
            return self._defer(config, handle, deadline_ts, attempt=0)
        report, offset = self._wait(backend, handle, deadline_ts)
        return self._finish(store, backend, handle, report, offset)

    def _defer(
        self, config: KineticConfig, handle: JobHandle, deadline_ts: float | None, attempt: int
    ) -> NoReturn:
        self.defer(
            trigger=KineticJobTrigger(
                handle=handle.to_dict(),
                config=config_to_json(config),
                poll_interval=self.poll_interval,
                deadline=deadline_ts,
                attempt=attempt,
            ),
            method_name="execute_complete",
            timeout=defer_timeout(deadline_ts, self.poll_interval),
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger: re-read real state, show the job's log, collect.

        A trigger *error* while the job still runs re-defers (up to
        ``MAX_REDEFER_ATTEMPTS``); a timeout, or errors beyond that, cancel the job.
        """
        if not event or "handle" not in event:
            raise AirflowException(f"kinetic trigger returned no usable event: {event!r}")
        handle = JobHandle.from_dict(event["handle"])
        self._handle = handle
        hook = KineticHook(self.kinetic_conn_id)
        backend = hook.get_backend(handle.backend)
        self._backend = backend
        report = backend.status(handle)
        self.log.info(
            "kinetic job %s resumed: trigger said %s, job is %s",
            handle.job_id,
            event.get("status"),
            report.describe(),
        )
        if report.status.is_terminal:
            return self._finish(hook.get_store(), backend, handle, report, 0)
        attempt = int(event.get("attempt") or 0) + 1
        if event.get("status") == "error" and attempt <= self.MAX_REDEFER_ATTEMPTS:
            self.log.warning(
                "trigger error (%s); waiting again (%d/%d)",
                event.get("message"),
                attempt,
                self.MAX_REDEFER_ATTEMPTS,
            )
            return self._defer(hook.get_config(), handle, event.get("deadline"), attempt)
        why = event.get("message") or event.get("status")
        backend.cancel(handle)
        self._show_logs(backend, handle, 0)
        raise KineticJobCancelled(
            f"kinetic job {handle.job_id} cancelled: trigger ended with "
            f"{event.get('status')} ({why}) while the job was {report.status.value}",
            job_id=handle.job_id,
        )

    def dry_run(self) -> dict[str, Any]:
        """The manifest this operator would submit, printed as YAML; creates nothing.

        Packs the payload (so its SHA-256 is real) and hashes local Data, but uploads
        nothing and needs no cluster credentials.  Templates are used as they stand.
        """
        config = KineticHook(self.kinetic_conn_id).get_config()
        store = config.store()
        identity = {"dag_id": self.dag_id, "task_id": self.task_id, "run_id": "dry_run"}
        planned = plan_job(self.build_request(identity, store.uri), config, store, "job-dryrun00")
        manifest = backend_class(planned.template.backend).manifest(planned.spec)
        print(to_yaml(manifest))
        return manifest

    # ---- waiting / finishing ------------------------------------------------------
    def _wait(
        self, backend: Backend, handle: JobHandle, deadline: float | None
    ) -> tuple[StatusReport, int]:
        offset, last = 0, None
        while True:
            report = backend.status(handle)
            offset = self._show_logs(backend, handle, offset)
            if report.describe() != last:
                self.log.info("kinetic job %s: %s", handle.job_id, report.describe())
                last = report.describe()
            if report.status.is_terminal:
                return report, offset
            if deadline is not None and time.time() >= deadline:
                backend.cancel(handle)
                raise KineticJobCancelled(
                    f"kinetic job {handle.job_id} cancelled at the task's execution_timeout",
                    job_id=handle.job_id,
                )
            time.sleep(self.poll_interval)

    def _show_logs(self, backend: Backend, handle: JobHandle, offset: int) -> int:
        text, new_offset = backend.read_logs(handle, offset)
        for line in text.splitlines():
            self.log.info("[%s] %s", handle.job_id, line)
        return new_offset

    def _finish(
        self,
        store: ObjectStore,
        backend: Backend,
        handle: JobHandle,
        report: StatusReport,
        offset: int,
    ) -> Any:
        self._show_logs(backend, handle, offset)
        self.log.info("kinetic job %s finished: %s", handle.job_id, report.describe())
        try:
            value = collect(store, handle.job_id, report.status, report.reason)
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
            if report.status is JobStatus.FAILED:
                # A failed job may hold a stuck pod (image pull, unschedulable): delete
                # it so nothing is orphaned; its log was already shown.
                try:
                    backend.cancel(handle)
                except Exception as exc:  # noqa: BLE001 - keep the job's own error
                    self.log.warning("could not delete failed job %s: %s", handle.job_id, exc)
        return value

    # ---- retries, deadlines, kill ---------------------------------------------------
    def _adopt(self, context: Any, backend: Backend) -> JobHandle | None:
        """On a retry, adopt the previous try's job if it is still running."""
        store = context.get("task_state_store")
        if store is None:
            return None
        try:
            previous = JobHandle.from_dict(store.get(XCOM_JOB))
        except Exception:  # noqa: BLE001 - an unreadable state store means "nothing to adopt"
            return None
        report = backend.status(previous)
        if report.status in (JobStatus.PENDING, JobStatus.RUNNING):
            self.log.info(
                "adopting still-%s kinetic job %s from an earlier try",
                report.status.value,
                previous.job_id,
            )
            return previous
        return None

    def _remember(self, context: Any, handle: JobHandle) -> None:
        store = context.get("task_state_store")
        if store is not None:
            try:
                store.set(XCOM_JOB, handle.to_dict())
            except Exception as exc:  # noqa: BLE001 - adoption is best effort
                self.log.warning("could not record the job in the task state store: %s", exc)

    def on_kill(self) -> None:
        """Cancel the job this try started (and only while it is unfinished)."""
        if self._handle is not None and self._backend is not None:
            self.log.info("task killed: cancelling kinetic job %s", self._handle.job_id)
            self._backend.cancel(self._handle)
