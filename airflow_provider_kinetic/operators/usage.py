"""The task's usage line and ``kinetic_usage`` XCom, once its work has ended.

What a task's jobs held (accelerator, capacity, chips) and for how long is summed by
``core.jobs.usage`` over every job the task run had (``TaskRecord.attempts``, or a
batch's entry); prices come from ``[kinetic] price_table`` when one is set.  Usage is
an account, never a reason to fail: anything that goes wrong here is a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_kinetic.core.jobs.usage import for_jobs, summary_line
from airflow_provider_kinetic.core.storage import ObjectStore

XCOM_USAGE = "kinetic_usage"


def report_usage(
    operator: Any, context: Any, store: ObjectStore, job_ids: Sequence[str]
) -> dict[str, Any] | None:
    """Log the one-line summary and push it as XCom ``kinetic_usage``; returns it."""
    from airflow_provider_kinetic.hooks.prices import load_price_table

    try:
        usage = for_jobs(store, list(job_ids), load_price_table(strict=False))
        operator.log.info("kinetic usage: %s", summary_line(usage))
        context["ti"].xcom_push(key=XCOM_USAGE, value=usage)
        return usage
    except Exception as exc:  # noqa: BLE001 - an account, never the task's outcome
        operator.log.warning("kinetic usage could not be summed: %s", exc)
        return None
