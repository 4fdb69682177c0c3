"""Pieces both kinetic operators share: task identity, output dirs, deadlines."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperator, conf

from airflow_provider_kinetic.core.accelerators import parse_accelerator, with_spot
from airflow_provider_kinetic.core.schemes import scheme_for
from airflow_provider_kinetic.core.submit import JobRequest

XCOM_JOB = "kinetic_job"
XCOM_BATCH = "kinetic_batch"
XCOM_OUTPUT_DIR = "output_dir"
_SAFE = re.compile(r"[^A-Za-z0-9._=-]+")


def default_output_key(identity: Mapping[str, Any]) -> str:
    """``outputs/{dag}/{run}/{task}/{map_index}``: a re-run of a DAG run writes in place."""
    parts = [
        identity["dag_id"],
        identity["run_id"],
        identity["task_id"],
        str(identity.get("map_index", -1)),
    ]
    return "outputs/" + "/".join(_SAFE.sub("_", str(p)) for p in parts)


def directory_uri(uri: str | None) -> str | None:
    """An output dir as XCom carries it: spelled (by its Data scheme) so that
    ``Data(<that value>)`` downstream is a directory with no string editing."""
    return scheme_for(uri).as_directory(uri) if uri else uri


def task_identity(context: Mapping[str, Any]) -> dict[str, Any]:
    ti = context["ti"]
    return {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "map_index": getattr(ti, "map_index", -1),
        "try_number": getattr(ti, "try_number", None),
    }


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


class KineticOperatorBase(BaseOperator):
    """Arguments and helpers every kinetic operator shares (see KineticRunOperator).

    Templated fields are assigned verbatim from the same-named arguments; they are
    validated in ``execute`` (after rendering), never here.
    """

    shallow_copy_attrs: Sequence[str] = ("python_callable",)
    python_callable: Callable[..., Any]
    op_kwargs: Mapping[str, Any] | None

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
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 5.0,
        cpu: str | None = None,
        memory: str | None = None,
        spot: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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

    def parsed_accelerator(self) -> Any:
        return parse_accelerator(self.accelerator_spec())

    def build_request(
        self,
        identity: Mapping[str, Any],
        store_uri: Callable[[str], str],
        context: Mapping[str, Any] | None = None,
    ) -> JobRequest:
        """The ``JobRequest`` of this task: every operator option lands here, once."""
        output_dir = self.output_dir or store_uri(default_output_key(identity))
        return JobRequest(
            func=self.python_callable,
            args=self.request_args(),
            kwargs=dict(self.op_kwargs or {}),
            accelerator=self.accelerator,
            spot=self.spot,
            volumes=self.rendered_volumes(context),
            capture_env_vars=self.capture_env_vars,
            output_dir=output_dir,
            identity=dict(identity),
            by_value_roots=by_value_roots(),
            cpu_request=self.cpu,
            memory_request=self.memory,
        )

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
