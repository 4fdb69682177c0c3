"""What the Kinetic tab of a task instance shows: that task's jobs and batches.

A task instance is found in the history (``history/{job_id}/entry.json`` keeps the
exact dag id, run id, task id, map index and try number of the task that submitted
it), read through the rows ``jobs list`` prints (``cli.joblist``), so the tab, the
list and the CLI agree on ids and states.  The tab shows the newest try's jobs in
full (a capacity chain may make several in one try; a map task makes one batch) and
earlier tries one line each.  A batch's children come from ``cli.joblist.child_rows``
(its manifest and saved live state, one backend query for their states).  Nothing
here renders HTML or knows about HTTP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_kinetic.cli.joblist import JobStatuses, TaskFilter, child_rows, history_rows
from airflow_provider_kinetic.core.batch.progress import Summary, summary
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.progress import Progress, read_progress
from airflow_provider_kinetic.core.jobs.usage import summary_line
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.stat import stat_objects
from airflow_provider_kinetic.deployment.prices import load_price_table
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.plugins.jobs import (
    FILES_LIMIT,
    JobRow,
    OutputFile,
    history_row,
    output_prefix,
    usage_of,
)

#: Children a batch's tab lists (every row costs nothing more than its manifest
#: entry, but a page of 10,000 rows helps nobody).
CHILDREN_LIMIT = 1000
#: A child's states that count as done in a batch's progress (it will not run again).
CHILD_DONE = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass
class TaskJob:
    """One job or batch of the task instance's newest try."""

    row: JobRow
    try_number: int | None
    logical_date: str | None
    #: What the tab shows as its state: a job's (backend, else history); a batch's
    #: from its children while its entry has not ended (:func:`batch_state`).
    state: str = ""
    reason: str | None = None
    usage_line: str = ""
    files: list[OutputFile] = field(default_factory=list)
    files_truncated: bool = False
    #: A batch's children (``cli.joblist.child_rows``): index, job id, state, reason.
    children: list[dict[str, Any]] = field(default_factory=list)
    children_truncated: bool = False
    total: int | None = None
    #: What a job's function last reported (``core.jobs.progress``; None: nothing, or
    #: its dir already cleaned up after it succeeded: the XCom keeps it).
    progress: Progress | None = None
    #: A batch's progress (:func:`batch_summary`).
    batch_progress: Summary | None = None
    #: TPU slices of a multi-slice job (a JobSet; its history entry's ``num_slices``).
    slices: int | None = None


@dataclass
class TaskView:
    """The tab of one task instance."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int | None = None
    jobs: list[TaskJob] = field(default_factory=list)
    #: Jobs of earlier tries, newest first (one line each on the tab).
    earlier: list[tuple[int | None, JobRow]] = field(default_factory=list)


def parse_map_index(text: str) -> int:
    """The ``{MAP_INDEX}`` of the tab's URL: a number, or the placeholder itself, which
    Airflow's UI leaves in the URL of a task that is not mapped (it replaces it only
    when the route has a map index)."""
    if text in ("", "{MAP_INDEX}", "%7BMAP_INDEX%7D"):
        return -1
    return int(text)


def _files(store: ObjectStore, output_dir: str | None) -> tuple[list[OutputFile], bool]:
    prefix = output_prefix(store, output_dir)
    if not prefix:
        return [], False
    objects = stat_objects(store, prefix)
    files = [OutputFile(key[len(prefix) :], objects[key][0]) for key in sorted(objects)]
    return files[:FILES_LIMIT], len(files) > FILES_LIMIT


def _try(row: dict[str, Any]) -> int:
    value = row.get("try_number")
    return value if isinstance(value, int) else 0


def task_view(conn_id: str, dag_id: str, run_id: str, task_id: str, map_index: int) -> TaskView:
    """The task instance's jobs: the newest try's in full, earlier tries' as rows."""
    statuses = JobStatuses(KineticHook(conn_id))
    store = statuses.store
    match = TaskFilter(run_id=run_id, task_id=task_id, map_index=map_index)
    messages: dict[str, str] = {}  # a live job's status message: why it waits
    rows = history_rows(statuses, history.Filter(dag_id=dag_id), match, messages)
    view = TaskView(dag_id, run_id, task_id, map_index)
    if not rows:
        return view
    newest = max(_try(row) for row in rows)
    view.try_number = newest or None
    prices = load_price_table(strict=False)
    for row in rows:
        if _try(row) != newest:
            view.earlier.append((row.get("try_number"), history_row(row, store)))
            continue
        job = TaskJob(history_row(row, store), row.get("try_number"), row.get("logical_date"))
        if row["job_id"] in messages:
            job.row.report = replace(job.row.report, message=messages[row["job_id"]])
        job.state, job.reason = job.row.report.status.value, job.row.report.reason
        entry = history.read(store, row["job_id"])
        live = entry is not None and entry.get("state") not in history.ENDED
        job.row.usage = usage_of(store, entry, prices, live=live)
        job.usage_line = summary_line(job.row.usage) if job.row.usage else ""
        job.files, job.files_truncated = _files(store, row.get("output_dir"))
        if not job.row.batch:
            job.progress = read_progress(store, row["job_id"])
            job.slices = (entry or {}).get("num_slices")
        if job.row.batch:
            children = child_rows(statuses, row)
            job.children = children[:CHILDREN_LIMIT]
            job.children_truncated = len(children) > CHILDREN_LIMIT
            job.total = (entry or {}).get("total")
            job.state, job.reason = batch_state(entry or {}, children)
            job.batch_progress = batch_summary(store, entry or {}, children)
        view.jobs.append(job)
    return view


def batch_state(entry: dict[str, Any], children: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A batch's state: its entry's once ended; before, RUNNING while a child runs
    (the entry says SUBMITTED until the batch ends: children are not written to it)."""
    state = str(entry.get("state") or history.SUBMITTED)
    if state in history.ENDED:
        return state, entry.get("reason")
    if any(c.get("state") in ("RUNNING", "PENDING") for c in children):
        done = sum(1 for c in children if c.get("state") == "SUCCEEDED")
        return "RUNNING", f"{done} of {entry.get('total') or len(children)} succeeded"
    return state, entry.get("reason")


def batch_summary(
    store: ObjectStore, entry: dict[str, Any], children: list[dict[str, Any]]
) -> Summary:
    """A batch's progress (``core.batch.progress``): children done of total, an ETA
    from those finished since it was submitted, each running child's step."""
    done = sum(1 for c in children if c.get("state") in CHILD_DONE)
    running = {int(c["child"]): str(c["job_id"]) for c in children if c.get("state") == "RUNNING"}
    submitted = history.iso_epoch(entry.get("submitted_at"))
    elapsed = None if submitted is None else time.time() - submitted
    total = int(entry.get("total") or len(children))
    return summary(store, total, done, running, elapsed)


def children_feed(conn_id: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The tab's refresh of one batch: its state, progress and its children's (JSON)."""
    statuses = JobStatuses(KineticHook(conn_id))
    row = {**entry, "kind": "batch"}
    children = child_rows(statuses, row)[:CHILDREN_LIMIT]
    state, reason = batch_state(entry, children)
    progress = batch_summary(statuses.store, entry, children)
    return {
        "state": state,
        "reason": reason or "",
        "terminal": state in history.ENDED,
        "progress": progress.to_json(),
        "children": [
            {
                **{key: child.get(key) for key in ("child", "job_id", "state", "reason")},
                "attempts": child.get("attempts"),
                "step": progress.steps.get(int(child["child"])),
            }
            for child in children
        ],
    }
