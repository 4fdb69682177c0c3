"""The task's usage line and ``kinetic_usage`` XCom, once its work has ended
(``deployment.usage`` sums it and sends its metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.usage import account

XCOM_USAGE = "kinetic_usage"


def report_usage(
    operator: Any, context: Any, store: ObjectStore, job_ids: Sequence[str]
) -> dict[str, Any] | None:
    """Log the one-line summary and push it as XCom ``kinetic_usage``; returns it."""
    usage = account(store, job_ids, getattr(context["ti"], "try_number", None), operator.log)
    if usage is None:
        return None
    try:
        context["ti"].xcom_push(key=XCOM_USAGE, value=usage)
        operator.kinetic_usage = usage  # the asset event's extra carries it too
    except Exception as exc:  # noqa: BLE001 - an account, never the task's outcome
        operator.log.warning("kinetic usage could not be pushed: %s", exc)
        return None
    return usage
