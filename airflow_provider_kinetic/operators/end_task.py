"""Whether a deferring task's trigger may end the task when its job succeeds
(``triggers.end_task``): only when nothing must run on a worker after the job.

A worker is needed for what only a task's own process can do at its end: asset events
(``output_asset``'s alias, declared outlets), an ``output_key``'s new version, a cache
entry (``cache=True``), lineage (an OpenLineage listener runs where the task ends),
``multiple_outputs`` (one XCom per key), and a deployment XCom backend (a trigger's
XComs go to Airflow's database as they are).  Everything else ends in the trigger.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.triggers.end_task import EndTask

#: ``[core] xcom_backend`` values that are Airflow's own (3.1 to 3.3).
DEFAULT_XCOM_BACKENDS = frozenset(
    {
        "airflow.sdk.execution_time.xcom.BaseXCom",
        "airflow.sdk.bases.xcom.BaseXCom",
        "airflow.models.xcom.BaseXCom",
    }
)


def trigger_ends_tasks() -> bool:
    """``[kinetic] trigger_ends_tasks`` (True): a deployment's way back to every task
    resuming on a worker after its job."""
    return conf.getboolean("kinetic", "trigger_ends_tasks", fallback=True)


def worker_needed(op: Any) -> str | None:
    """What must run on a worker after ``op``'s job, or None."""
    if not trigger_ends_tasks():
        return "[kinetic] trigger_ends_tasks = False"
    if op.outlets:
        return "its asset events (output_asset, outlets)"
    if getattr(op, "output_key", None):
        return f"output_key {op.output_key!r}"
    if getattr(op, "cache_settings", None) is not None:
        return "cache=True"
    if getattr(op, "multiple_outputs", False):
        return "multiple_outputs"
    if getattr(op, "return_result", False):  # a sensor: no task record holds the value
        return "return_result=True"
    backend = conf.get("core", "xcom_backend", fallback="") or ""
    if backend and backend not in DEFAULT_XCOM_BACKENDS:
        return f"the XCom backend {backend}"
    if lineage_on():
        return "OpenLineage"
    return None


def lineage_on() -> bool:
    """Whether the OpenLineage provider is installed and configured to emit."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    try:
        return not is_disabled()
    except Exception:  # noqa: BLE001 - cannot tell: let the worker emit it
        return True


def decide(
    op: Any, identity: dict[str, Any], *, collect: bool = True, ordered: bool = True
) -> dict[str, Any] | None:
    """The trigger's ``end_task`` kwarg for ``op``'s try (None: a worker finishes it);
    the log says which.  ``collect=False``: the task takes no value from the job
    (``KineticJobSensor`` without ``return_result``); ``ordered``: a map task's."""
    why = worker_needed(op)
    if why is not None:
        op.log.info("kinetic: a worker finishes this task after its job (%s)", why)
        return None
    op.log.info("kinetic: the trigger ends this task when its work succeeds")
    push = bool(getattr(op, "do_xcom_push", True)) and collect
    end = EndTask(
        cleanup=op.cleanup,
        identity=dict(identity),
        push_value=push,
        collect=collect,
        ordered=ordered,
    )
    return end.to_dict()
