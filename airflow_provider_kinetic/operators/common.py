"""Pieces both kinetic operators share: task identity, output dirs, deadlines."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping
from typing import Any

from airflow.providers.common.compat.sdk import conf

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
