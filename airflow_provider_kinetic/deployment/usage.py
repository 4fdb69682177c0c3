"""A task's usage, summed and sent once its work has ended: the same from a worker
(``operators.usage``, which also pushes XCom ``kinetic_usage``) and from a trigger that
ends its task itself (``triggers.end_task``, which hands the XCom to Airflow in its
event).

What a task's jobs held (accelerator, capacity, chips) and for how long is summed by
``core.jobs.usage`` over every job the task run had (``TaskRecord.attempts``, or a
batch's entry); prices come from ``[kinetic] price_table`` when one is set.  Usage is
an account, never a reason to fail: anything that goes wrong here is a warning.

The same numbers go out as metrics (``deployment/metrics.py``; nothing is done with metrics
off): each ended job or batch once, by the try that ran or collected it (an earlier
try's jobs were sent by that try), so a retried task does not count them twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.usage import for_jobs, summary_line
from airflow_provider_kinetic.core.spec.handles import REASON_NO_CAPACITY
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment import metrics as _airflow_metrics  # noqa: F401 - the sink


def account(
    store: ObjectStore, job_ids: Sequence[str], try_number: int | None, log: Any
) -> dict[str, Any] | None:
    """The usage of ``job_ids`` (priced), its one-line summary logged and its metrics
    sent; None (a warning) when it could not be summed."""
    from airflow_provider_kinetic.deployment.prices import load_price_table

    try:
        usage = for_jobs(store, list(job_ids), load_price_table(strict=False))
        log.info("kinetic usage: %s", summary_line(usage))
    except Exception as exc:  # noqa: BLE001 - an account, never the task's outcome
        log.warning("kinetic usage could not be summed: %s", exc)
        return None
    try:
        if metrics.enabled():
            send_metrics(store, usage, job_ids, try_number)
    except Exception as exc:  # noqa: BLE001 - metrics never fail a task
        log.debug("kinetic usage metrics not sent: %s", exc)
    return usage


def send_metrics(
    store: ObjectStore, usage: dict[str, Any], job_ids: Sequence[str], try_number: int | None
) -> None:
    """Per ended job or batch this try ran (its ``try_number``) or collected (the last
    id): ``kinetic.job.ended``, ``.queued`` and ``.run`` (a batch: one sample, the mean
    over its children), ``.chip_seconds``, and for a single job its preemption and its
    capacity step given up (a batch's are counted live, by ``core.batch.run.observe``); a
    failed job's carry its ``failure_class``."""
    last = job_ids[-1] if job_ids else None
    for attempt in usage.get("attempts_detail") or []:
        mine = attempt.get("job_id") == last or attempt.get("try_number") == try_number
        if attempt.get("running") or not mine:
            continue
        entry = history.read(store, attempt["job_id"]) or {}
        batch = attempt.get("kind") == "batch"
        tags = {
            "dag_id": attempt.get("dag_id"),
            "task_id": attempt.get("task_id"),
            "accelerator": attempt.get("accelerator"),
            "backend": entry.get("backend"),
            "capacity": attempt.get("capacity"),
            "kind": attempt.get("kind") or "job",
        }
        if attempt.get("failure_class"):  # what failed (core.spec.failure)
            tags["failure_class"] = attempt["failure_class"]
        jobs = max(1, int(attempt.get("jobs") or 1))
        metrics.incr("kinetic.job.ended", jobs, {**tags, "state": attempt.get("state")})
        measured = max(1, int(attempt.get("measured_jobs") or 1)) if batch else 1
        for key, name in (("queued_s", "kinetic.job.queued"), ("run_s", "kinetic.job.run")):
            if attempt.get(key) is not None:
                metrics.timing(name, attempt[key] / measured, tags)
        if attempt.get("chip_hours"):
            metrics.incr("kinetic.job.chip_seconds", round(attempt["chip_hours"] * 3600), tags)
        if batch:
            continue
        if attempt.get("preempted"):
            metrics.incr("kinetic.job.preemptions", 1, tags)
        gave_up = str(entry.get("reason") or "").startswith(REASON_NO_CAPACITY)
        if gave_up and attempt.get("state") == history.CANCELLED:  # the next step followed
            metrics.incr("kinetic.job.capacity_steps", 1, tags)
