"""Pieces both kinetic operators share: task identity, output dirs, deadlines."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import BaseOperator, conf, mask_secret

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.catalog.accelerators import with_spot
from airflow_provider_kinetic.core.catalog.capacity import DEFAULT_CAPACITY_WAIT_S
from airflow_provider_kinetic.core.data.schemes import scheme_for
from airflow_provider_kinetic.core.jobs.checkpoint import (
    DEFAULT_SYNC_S,
    RESTORE_SAME_WORK,
    validate_restore,
    validate_sync_s,
)
from airflow_provider_kinetic.core.jobs.cleanup import DEFAULT_POLICY
from airflow_provider_kinetic.core.jobs.cleanup import policy as cleanup_policy
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.pack import DEFAULT_MAX_PAYLOAD_MB
from airflow_provider_kinetic.core.jobs.request import JobRequest, capture_env, plan_for_request
from airflow_provider_kinetic.core.jobs.resultcache import CacheSettings
from airflow_provider_kinetic.core.logat import info_at, timed_lines
from airflow_provider_kinetic.core.runtime.context import DEFAULT_MAX_CONTEXT_MB, check_patterns
from airflow_provider_kinetic.core.runtime.images import ImagePlan, check_image_setting
from airflow_provider_kinetic.core.runtime.requirements import check_spec as check_requirements
from airflow_provider_kinetic.core.spec.debug import DebugSettings
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.spec.identity import task_key, ti_identity
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.operators.capacity import check_options as check_capacity
from airflow_provider_kinetic.operators.capacity import check_slices, gang_restarts, slices_value
from airflow_provider_kinetic.operators.capacity import request_fields as capacity_fields
from airflow_provider_kinetic.operators.lineage import KineticTaskLineage

XCOM_JOB = "kinetic_job"
XCOM_BATCH = "kinetic_batch"
XCOM_OUTPUT_DIR = "output_dir"
#: The function's last progress update (``core.jobs.progress``).
XCOM_PROGRESS = "kinetic_progress"
#: A batch's per-input output dirs, in input order (``output_dir`` stays the parent).
XCOM_OUTPUT_DIRS = "kinetic_output_dirs"
#: The key of a task's returned value.
XCOM_RETURN_KEY = "return_value"


def default_output_key(identity: Mapping[str, Any]) -> str:
    """``outputs/{dag}/{run}/{task}/{map_index}``: a re-run of a DAG run writes in place;
    each part is ``core.spec.identity.key_part`` (distinct runs, distinct dirs)."""
    return "outputs/" + task_key(identity)


#: Deferrable tasks on a backend that sees a job end cheaply (the local one) watch
#: their jobs this long before deferring: short jobs never enter the triggerer (nor pay
#: its settling hold, ``triggers.settle``); a batch defers once nothing ended for this long.
DEFER_GRACE_S = 5.0


def defer_grace_s() -> float:
    """``[kinetic] defer_grace_s`` (default ``DEFER_GRACE_S``; 0 defers at once)."""
    return conf.getfloat("kinetic", "defer_grace_s", fallback=DEFER_GRACE_S)


def push_value(operator: Any, context: Mapping[str, Any], value: Any) -> None:
    """Push the task's value to XCom now, before its job's artifacts are deleted and its
    record says "delivered": a value Airflow refuses fails the task here, with the
    result still in the store for the retry to collect (never a second run).  Airflow
    pushes the returned value again afterwards (same value, same key), except where the
    deployment's XCom backend offloads values (``operators.xcoms.offloaded``): each push
    there writes an object of its own and Airflow does not remove the one it replaces,
    so this try turns Airflow's own push off (``restore_xcom_push`` turns it back on
    when the next try opens; with ``multiple_outputs`` Airflow's push, which adds the
    keys, stays)."""
    if not getattr(operator, "do_xcom_push", True):
        return
    context["ti"].xcom_push(key=XCOM_RETURN_KEY, value=value)
    from airflow_provider_kinetic.operators.xcoms import offloaded

    if offloaded() and not getattr(operator, "multiple_outputs", False):
        operator.kinetic_declared_xcom_push = True
        operator.do_xcom_push = False


def restore_xcom_push(operator: Any) -> None:
    """A try opens with Airflow's push of the returned value as declared (an earlier
    try in the same process, ``dag.test``, may have turned it off: ``push_value``)."""
    if getattr(operator, "kinetic_declared_xcom_push", False):
        operator.do_xcom_push = True


def directory_uri(uri: str | None) -> str | None:
    """An output dir as XCom carries it: spelled (by its Data scheme) so that
    ``Data(<that value>)`` downstream is a directory with no string editing."""
    return scheme_for(uri).as_directory(uri) if uri else uri


def task_identity(context: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **ti_identity(context["ti"]),
        # As Airflow shows it (None for a run without one): the jobs list and the
        # Kinetic page show and filter by it.
        "logical_date": _iso(context.get("logical_date")),
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else (str(value) if value else None)


def by_value_roots() -> list[str]:
    """Code under the DAGs folder travels by value: the pod has no DAG files."""
    return [conf.get("core", "dags_folder", fallback="")]


def deadline(context: Mapping[str, Any], execution_timeout: dt.timedelta | None) -> float | None:
    """Epoch seconds at which the task's execution_timeout expires (None if unset).

    Airflow does not enforce execution_timeout while a task is deferred, so the
    triggers carry this deadline themselves.
    """
    if not execution_timeout:
        return None
    start = getattr(context["ti"], "start_date", None) or dt.datetime.now(dt.UTC)
    return (start + execution_timeout).timestamp()


def defer_timeout(deadline_ts: float | None, poll_interval: float) -> dt.timedelta | None:
    """A defer() timeout padded past the deadline, so the trigger's own timeout event
    (after which the operator cancels the job) arrives before Airflow's ``__fail__``."""
    if deadline_ts is None:
        return None
    pad = max(60.0, 2 * poll_interval)
    return dt.timedelta(seconds=max(0.0, deadline_ts - time.time()) + pad)


def rendered_as(field: str, value: Any, kind: type | tuple[type, ...], what: str) -> None:
    """A templated field that must be ``kind`` after rendering, or a clear error: a Jinja
    template (``"{{ dag_run.conf }}"``) renders to a *string* unless the DAG renders
    native objects."""
    if value is None or isinstance(value, kind):
        return
    hint = ""
    if isinstance(value, str):
        hint = (
            "; a Jinja template renders to a string: set render_template_as_native_obj=True "
            "on the DAG to get Python objects, or pass the value itself"
        )
    raise TypeError(
        f"{field} must be {what} after template rendering, got {type(value).__name__} "
        f"{value!r:.120}{hint}"
    )


#: ``deferrable=``'s default on every kinetic operator, as on Airflow's own.
DEFAULT_DEFERRABLE = conf.getboolean("operators", "default_deferrable", fallback=False)
#: Processes that noted ``[kinetic] trigger_queue`` cannot be honoured (once each).
_QUEUE_NOTED: set[str] = set()


def to_trigger_queue(op: Any) -> str | None:
    """``[kinetic] trigger_queue``: the triggerer queue a Kinetic task's trigger runs in
    (a dedicated triggerer for heavy log-following: ``airflow triggerer --queues``).
    Airflow 3.2+ gives a trigger its task's ``queue`` at deferral when ``[triggerer]
    queues_enabled`` is on (``task_runner._defer_task``), so the task's queue is set to
    it just before deferring; the resumed task is queued as its task instance says,
    unchanged.  Airflow 3.1 has no trigger queues: noted once per process, ignored."""
    wanted = conf.get("kinetic", "trigger_queue", fallback="") or ""
    if not wanted:
        return None
    if not conf.getboolean("triggerer", "queues_enabled", fallback=False):
        if wanted not in _QUEUE_NOTED:
            _QUEUE_NOTED.add(wanted)
            op.log.info(
                "kinetic: [kinetic] trigger_queue = %s is not used: it needs Airflow 3.2+ "
                "with [triggerer] queues_enabled = True",
                wanted,
            )
        return None
    op.queue = wanted
    return wanted


class KineticOperatorBase(KineticTaskLineage, BaseOperator):
    """Arguments and helpers every kinetic operator shares (see KineticRunOperator).

    Templated fields are assigned verbatim from the same-named arguments; they are
    validated in ``execute`` (after rendering), never here.
    """

    def defer(self, **kwargs: Any) -> NoReturn:  # type: ignore[override]
        """Airflow's ``defer``, the trigger routed to ``[kinetic] trigger_queue``."""
        to_trigger_queue(self)
        super().defer(**kwargs)
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    shallow_copy_attrs: Sequence[str] = ("python_callable",)
    python_callable: Callable[..., Any]
    op_kwargs: Mapping[str, Any] | None
    #: ``cache=True``'s settings (``core.jobs.resultcache``); None: results not reused.
    cache_settings: CacheSettings | None = None
    #: ``debug=True``'s settings (``operators.debug``; a map has none: off).
    debug_settings: DebugSettings = DebugSettings()

    # ``python_callable`` is set by subclasses, not taken here: the TaskFlow
    # decorator's apply-defaults hook injects ``op_kwargs`` into any __init__ that
    # receives ``python_callable``.
    def __init__(
        self,
        *,
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_capacity(accelerator, spot, capacity, capacity_wait, max_run_duration)
        self.capacity = capacity
        self.capacity_wait = capacity_wait
        self.priority_class = priority_class
        self.max_run_duration = max_run_duration
        self.checkpoint_sync_s = validate_sync_s(checkpoint_sync_s)  # fails at parse time
        self.checkpoint_restore = validate_restore(checkpoint_restore)
        self.cleanup = cleanup_policy(cleanup)  # a bad value fails at parse time
        # Checked here (not templated): a bad pattern fails at parse time, not in the pod.
        self.context_excludes = check_patterns(context_excludes)
        # Not templated either: a bad mode or URI fails at parse time.
        self.container_image = check_image_setting(container_image, "operator")
        self.requirements = check_requirements(requirements)
        self.spot = spot
        self.accelerator = accelerator
        self.volumes = volumes
        self.output_dir = output_dir
        self.capture_env_vars = capture_env_vars
        self.kinetic_conn_id = kinetic_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.cpu = cpu
        self.memory = memory

    # ---- the one request builder (single jobs and batches) --------------------------
    def request_args(self) -> tuple[Any, ...]:
        """Positional arguments shared by every job (a batch's come from its inputs)."""
        return ()

    def accelerator_spec(self) -> str:
        """``accelerator`` with ``:spot`` when ``spot=True``."""
        return with_spot(self.accelerator, self.spot)

    #: TPU slices joined into one job (``KineticRunOperator(num_slices=...)``; a map's
    #: inputs are one slice each).
    num_slices: Any = 1

    def set_slices(self, num_slices: Any) -> None:
        """``num_slices``, checked at parse time against the accelerator (GPUs, CPU and
        TPUs GKE cannot join are refused, naming what is allowed)."""
        check_slices(self.accelerator, self.spot, num_slices)
        self.num_slices = num_slices

    def slice_count(self) -> int:
        """The rendered ``num_slices`` (checked when the request's options are made)."""
        return slices_value(self.num_slices)

    def build_request(
        self,
        identity: Mapping[str, Any],
        store_uri: Callable[[str], str],
        context: Mapping[str, Any] | None = None,
    ) -> JobRequest:
        """The ``JobRequest`` of this task: every operator option lands here, once (how
        and where the job runs as one ``JobOptions``, checked as it is made).

        Captured env values are registered with Airflow's secrets masker, so a value
        the function prints is masked in the task log.
        """
        rendered_as("op_kwargs", self.op_kwargs, Mapping, "a mapping (dict)")
        rendered_as("volumes", self.volumes, Mapping, "a mapping (dict) of mount path -> Data")
        output_dir = self.output_dir or store_uri(default_output_key(identity))
        for value in capture_env(self.capture_env_vars).values():
            mask_secret(value)
        return JobRequest(
            func=self.python_callable,
            args=self.request_args(),
            kwargs=dict(self.op_kwargs or {}),
            options=JobOptions(
                accelerator=self.accelerator,
                spot=self.spot,
                cpu=self.cpu,
                memory=self.memory,
                **capacity_fields(
                    self.capacity, self.capacity_wait, self.priority_class, self.max_run_duration
                ),
                checkpoint_sync_s=self.checkpoint_sync_s,
                checkpoint_restore=self.checkpoint_restore,
                num_slices=self.slice_count(),
                max_restarts=gang_restarts(self),
                debug_port=self.debug_settings.port,
                debug_wait_s=self.debug_settings.wait_s,
            ),
            volumes=self.rendered_volumes(context),
            capture_env_vars=self.capture_env_vars,
            output_dir=output_dir,
            identity=dict(identity),
            by_value_roots=by_value_roots(),
            entry_file=self.dag.fileloc if self.has_dag() else None,
            context_excludes=list(self.context_excludes),
            container_image=self.container_image,
            requirements=self.requirements,
            max_context_mb=conf.getfloat(
                "kinetic", "max_context_mb", fallback=DEFAULT_MAX_CONTEXT_MB
            ),
            max_payload_mb=conf.getfloat(
                "kinetic", "max_payload_mb", fallback=DEFAULT_MAX_PAYLOAD_MB
            ),
            # The default output dir is the task run's own: left out of the reuse key.
            cache=replace(self.cache_settings, default_output=not self.output_dir)
            if self.cache_settings is not None
            else None,
        )

    def resolve_image(
        self, request: JobRequest, config: Any, store: ObjectStore, build: bool
    ) -> ImagePlan:
        """The task's image, resolved once and carried by ``request`` (every job of the
        task runs in it).  With ``build`` a missing bundled image is built now, before
        anything of the job is uploaded (``gcp/image_build.py``)."""
        from airflow_provider_kinetic.gcp.image_build import prepare_image

        plan = plan_for_request(
            request, config, config.backend_kind(self.accelerator_spec(), self.slice_count())
        )
        if build:
            prepare_image(plan, config, store)
            self.log.info("kinetic: %s", plan.describe())
        request.image_plan = plan
        return plan

    def image_report(self, plan: ImagePlan, config: Any) -> list[str]:
        """Dry-run lines (YAML comments) naming the image and, for a bundled one,
        whether it exists or would be built (looked up with the connection's
        credentials; a lookup that cannot be made says why)."""
        lines = [f"# image: {plan.describe()}"]
        if plan.mode == "bundled":
            from airflow_provider_kinetic.gcp.image_build import ImageBuildHook

            try:
                found = ImageBuildHook(config).exists(plan)
            except Exception as exc:  # noqa: BLE001 - a dry run reports, it does not fail
                lines.append(f"# image status: unknown (lookup failed: {exc})")
            else:
                state = "exists" if found else "would be built with Cloud Build"
                lines.append(f"# image status: {state} (tag {plan.tag})")
        return lines

    def rendered_volumes(self, context: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``volumes`` with its mount paths rendered (Airflow renders dict values only)."""
        if not isinstance(self.volumes, dict) or context is None:
            return self.volumes
        return {self.render_template(k, context): v for k, v in self.volumes.items()}

    @staticmethod
    def require_callable(python_callable: Any) -> Callable[..., Any]:
        if not callable(python_callable):
            raise TypeError(f"python_callable must be callable, got {python_callable!r}")
        return python_callable


def show_job_logs(backend: Backend, handle: JobHandle, offset: int, log: Any) -> int:
    """The job's log from ``offset`` into the task log, each line at the time the job
    wrote it where the backend knows it (``core.logat``); the new offset."""
    text, new_offset = backend.read_logs(handle, offset)
    for line, ns in timed_lines(text):
        info_at(log, ns, "[%s] %s", handle.job_id, line)
    return new_offset
