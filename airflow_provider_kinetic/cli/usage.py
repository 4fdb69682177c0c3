"""``airflow kinetic usage``: what the history says jobs held, summed per DAG, task,
accelerator or capacity.

Every job and every batch with a history entry submitted in the window counts, with
the usage ``core.jobs.usage`` gives it (frozen into the entry when the job ended,
else measured from its artifacts now): attempts, jobs (a batch's children), preemptions,
chip-hours, run hours and queued time; an estimated cost only when ``[kinetic]
price_table`` names a table (``deployment/prices.py``), never otherwise.  Read-only: nothing
is written, so a job's numbers here are the ones its task logged.
"""

from __future__ import annotations

import time
from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.cli.common import CliError, command, output_format
from airflow_provider_kinetic.cli.jobs import parse_since
from airflow_provider_kinetic.cli.output import emit, human_age
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.resultcache import HIT_KIND
from airflow_provider_kinetic.core.jobs.usage import PriceTable, job_usage, total
from airflow_provider_kinetic.deployment.prices import load_price_table
from airflow_provider_kinetic.hooks.kinetic import KineticHook

#: ``--by`` -> the usage fields that name a group.
BY = {
    "dag": ("dag_id",),
    "task": ("dag_id", "task_id"),
    "accelerator": ("accelerator",),
    "capacity": ("capacity",),
}
COUNTS = ("attempts", "jobs", "preemptions", "running", "unmeasured_jobs")


def _row(names: dict[str, Any], summed: dict[str, Any]) -> dict[str, Any]:
    """One group's sums (the per-attempt detail stays out: ``-o json`` is for sums)."""
    row = {**names, **{key: summed[key] for key in COUNTS}}
    row.update(
        chip_hours=round(summed["chip_hours"], 6),
        run_s=summed["run_s"],
        queued_s=summed["queued_s"],
    )
    if "cost" in summed:
        row.update(cost=summed["cost"], unpriced_chip_hours=round(summed["unpriced_chip_hours"], 6))
    return row


def usage_rows(
    usages: list[dict[str, Any]], by: str, prices: PriceTable | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows per group (sorted by name) and the row of everything."""
    fields = BY[by]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for usage in usages:
        key = tuple(str(usage.get(f)) if usage.get(f) is not None else "" for f in fields)
        groups.setdefault(key, []).append(usage)
    rows = [
        _row(dict(zip(fields, key, strict=True)), total(found, prices))
        for key, found in sorted(groups.items())
    ]
    return rows, _row(dict.fromkeys(fields, ""), total(usages, prices))


def _table_row(row: dict[str, Any], priced: bool) -> dict[str, Any]:
    out = dict(row)
    out["chip_hours"] = f"{row['chip_hours']:.2f}"
    out["run_hours"] = f"{row['run_s'] / 3600:.2f}"
    out["queued"] = human_age(row["queued_s"]) or "0s"
    out["unmeasured"] = row["unmeasured_jobs"] or ""
    if priced:
        out["cost"] = f"${row['cost']:,.2f}"
        out["unpriced"] = f"{row['unpriced_chip_hours']:.2f}" if row["unpriced_chip_hours"] else ""
    return out


@command
def usage(args: Namespace) -> None:
    """Usage from the history in the window, summed per ``--by`` group."""
    by = args.by or "dag"
    if by not in BY:
        raise CliError(f"--by {by!r}: one of {', '.join(BY)}")
    now = time.time()
    since = parse_since(args.since, now) if getattr(args, "since", None) else None
    prices = load_price_table()
    store = KineticHook(args.conn_id).get_store()
    entries = history.without_children(
        history.entries(store, history.Filter(args.dag_id, None, since))
    )
    entries = [e for e in entries if e.get("kind") != HIT_KIND]  # a cache hit ran nothing
    usages = [job_usage(store, entry, now=now) for entry in entries]
    rows, overall = usage_rows(usages, by, prices)
    if output_format(args) == "json":
        emit(
            {
                "by": by,
                "dag_id": args.dag_id,
                "since": history.now_iso(since) if since is not None else None,
                "priced": prices is not None,
                "groups": rows,
                "total": overall,
            },
            "json",
        )
        return
    columns = [*BY[by], "attempts", "jobs", "preemptions", "chip_hours", "run_hours", "queued"]
    columns += ["running", "unmeasured"] + (["cost", "unpriced"] if prices is not None else [])
    shown = [_table_row(row, prices is not None) for row in rows]
    if rows:
        shown.append(_table_row({**overall, BY[by][0]: "(total)"}, prices is not None))
    emit(shown, "table", columns)
