"""What the Kinetic pages show, read through the code the CLI and ``attach`` use.

The jobs list is ``cli.inventory.list_jobs`` (the store is the only inventory) with
statuses from the CLI's normaliser; one job is ``attach(job_id)``, so the page trusts
a stored ``handle.json`` no further than the CLI does (job id and backend kind only).
A job whose value was delivered has no ``handle.json`` any more (``cleanup=
"artifacts"`` deletes ``{job_id}/``), but its task's sealed record still holds its
handle: such jobs are listed and opened from the record, so the task's job link
keeps working.  Usage (``core.jobs.usage``: capacity, queued and run time, chip-hours,
an estimated cost with ``[kinetic] price_table``) comes from each row's history entry
in the list (the usage frozen when the job ended; a job whose end the history has not
seen is measured from its artifacts, as the job page measures every job).  Nothing
here renders HTML or knows about HTTP.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.attached import AttachedJob, attach
from airflow_provider_kinetic.cli import inventory
from airflow_provider_kinetic.cli.joblist import JobStatuses, history_rows
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.batch.manifest import manifest_key
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.progress import read_progress
from airflow_provider_kinetic.core.jobs.signing import AUTH_HMAC
from airflow_provider_kinetic.core.jobs.usage import PriceTable, job_usage, summary_line, total
from airflow_provider_kinetic.core.spec.handles import (
    InvalidHandleError,
    JobHandle,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.core.storage.stat import stat_objects
from airflow_provider_kinetic.deployment.prices import load_price_table
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.hooks.kinetic import KineticHook

#: Job ids are one path segment (``job-...``); anything else never reaches the store.
JOB_ID = re.compile(r"job-[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
CONN_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")
GROUP_ID = re.compile(r"grp-[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
#: Rows the list shows (newest first): every row costs a status call and a listing.
LIST_LIMIT = 200
#: Files of an output dir the job page lists.
FILES_LIMIT = 500


@dataclass
class JobRow:
    """One job as a page shows it."""

    handle: JobHandle
    report: StatusReport
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: str | None = None
    started: str = ""
    ended: str = ""
    #: A batch's history entry (its page is the batch's children), not one job.
    batch: bool = False
    #: ``core.jobs.usage.total`` of this one job or batch (None: no history entry).
    usage: dict[str, Any] | None = None

    @property
    def job_id(self) -> str:
        return self.handle.job_id

    @property
    def terminal(self) -> bool:
        return self.report.status.is_terminal


@dataclass
class OutputFile:
    """A file under the job's output dir, by its name relative to that dir."""

    name: str
    size: int


@dataclass
class JobDetail:
    """The job page: its row, where its files live and the files themselves."""

    row: JobRow
    output_dir: str | None
    artifacts: str
    files: list[OutputFile] = field(default_factory=list)
    files_truncated: bool = False
    #: The usage line (``core.jobs.usage.summary_line``), when the history knows the job.
    usage_line: str = ""


def _with_task(entry: inventory.JobEntry, index: inventory.TaskIndex) -> inventory.JobEntry:
    found = index.lookup(entry.handle)
    if found is not None:
        entry.dag_id, entry.run_id, entry.task_id, entry.map_index = found
    else:
        entry.dag_id = inventory.dag_from_output_dir(entry.handle.output_dir)
    return entry


def _row(
    entry: inventory.JobEntry, report: StatusReport, store: ObjectStore, index: inventory.TaskIndex
) -> JobRow:
    row = JobRow(
        entry.handle,
        report,
        entry.dag_id,
        entry.run_id,
        entry.task_id,
        entry.map_index,
        started=entry.handle.created_at,
    )
    if report.status.is_terminal:
        record = index.handles.get(entry.handle.job_id)
        key = record[0] if record else None
        row.ended = inventory.last_write(store, entry.handle.job_id, key) or ""
    return row


def _collected(index: inventory.TaskIndex, present: set[str]) -> list[inventory.JobEntry]:
    """Jobs only a task record still names (their ``{job_id}/`` was cleaned up)."""
    entries = []
    for job_id, (_, data) in index.handles.items():
        if job_id in present:
            continue
        try:
            handle = JobHandle.from_dict(data)
        except (InvalidHandleError, TypeError, ValueError):
            continue
        entries.append(_with_task(inventory.JobEntry(handle), index))
    return entries


#: History states the page shows as the nearest backend state (the reason says which).
_AS_STATUS = {
    "SUBMITTED": (JobStatus.PENDING, "submitted"),
    history.CANCELLED: (JobStatus.FAILED, "cancelled"),
    "PREEMPTED": (JobStatus.FAILED, "preempted"),
}


def history_row(row: dict, store: ObjectStore) -> JobRow:
    """A ``jobs list`` row (``cli.joblist.history_rows``) as the page shows it."""
    state = str(row.get("state") or "NOT_FOUND")
    status, default_reason = _AS_STATUS.get(state, (None, None))
    if status is None:
        status = JobStatus(state) if state in JobStatus.__members__ else JobStatus.NOT_FOUND
    handle = JobHandle(
        job_id=row["job_id"],
        backend=row.get("backend") or "local",
        bucket_name=store.bucket,
        accelerator=row.get("accelerator") or "",
        func_name=row.get("func") or "",
        created_at=row.get("submitted_at") or "",
        group_id=row.get("group_id"),
        output_dir=row.get("output_dir"),
    )
    mi = row.get("map_index")
    # A failed job's reason: what failed, as the task log said it (class and phase).
    failure = row.get("failure") if state == JobStatus.FAILED.value else None
    return JobRow(
        handle,
        StatusReport(status, failure or row.get("reason") or default_reason),
        row.get("dag_id"),
        row.get("run_id"),
        row.get("task_id"),
        None if mi is None else str(mi),
        started=row.get("submitted_at") or "",
        ended=row.get("ended_at") or "",
        batch=row.get("kind") == "batch",
    )


def usage_of(
    store: ObjectStore, entry: dict | None, prices: PriceTable | None, *, live: bool
) -> dict[str, Any] | None:
    """One job's (or batch's) usage summed as a task's is, so the page shows the same
    fields as the ``kinetic_usage`` XCom; None without a history entry."""
    return None if entry is None else total([job_usage(store, entry, live=live)], prices)


def list_rows(conn_id: str, group: str | None = None, limit: int = LIST_LIMIT) -> list[JobRow]:
    """The newest jobs (and batches) of a connection's store from its history, with
    the live status of those that have not ended; with ``group``, that batch's
    children that are still in the store."""
    statuses = JobStatuses(KineticHook(conn_id))
    store = statuses.store
    if group is None:
        found = history_rows(statuses, history.Filter())
        rows = [history_row(row, store) for row in found[:limit]]
        prices = load_price_table(strict=False)
        for row in rows:
            # Measured from its artifacts only while the history has not seen its end
            # (the page asks its backend then anyway); else the entry alone.
            entry = history.read(store, row.job_id)
            live = entry is not None and entry.get("state") not in history.ENDED
            row.usage = usage_of(store, entry, prices, live=live)
        return rows
    index = inventory.task_index(store, deployment_secret())
    entries = inventory.list_jobs(store, deployment_secret(), index)
    entries += _collected(index, {e.handle.job_id for e in entries})
    entries.sort(key=lambda e: (e.handle.created_at, e.handle.job_id), reverse=True)
    rows = []
    for entry in entries:
        if entry.handle.group_id != group:
            continue
        report = statuses(entry.handle)
        if report is None:
            continue
        rows.append(_row(entry, report, store, index))
        if len(rows) >= limit:
            break
    return rows


@dataclass
class OpenJob:
    """A job to show: attached, with its task and the task records it was found by."""

    job: AttachedJob
    entry: inventory.JobEntry
    index: inventory.TaskIndex


def open_job(conn_id: str, job_id: str, batch: str | None = None) -> OpenJob:
    """``attach`` the job, or build it from the sealed record of the task that ran it
    when its ``handle.json`` is gone (a batch's child, whose task record names only
    its batch: from ``batch``'s history entry, when that names it as its child);
    ValueError for an id that is not one, ObjectNotFound when none names it."""
    if not JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a kinetic job id: {job_id!r}")
    hook = KineticHook(conn_id)
    store = hook.get_store()
    index = inventory.task_index(store, deployment_secret())
    try:
        job = attach(job_id, conn_id=conn_id)
    except ObjectNotFound:
        entry = history.read(store, job_id)
        if entry is None and batch and job_id not in index.handles:
            entry = _child_entry(store, batch, job_id)
        if job_id not in index.handles and entry is None:
            raise
        # The record is sealed with the deployment secret; the object name, namespace
        # and bucket still come from the connection, as ``attach`` takes them.  The
        # history (unsigned) only names the job and its backend kind.
        if job_id in index.handles:
            stored = JobHandle.from_dict(index.handles[job_id][1])
        else:
            assert entry is not None
            stored = history_row(entry, store).handle
        handle = stored.evolve(
            k8s_name=backend_class(stored.backend).object_name(job_id),
            namespace=hook.get_config().namespace,
            bucket_name=store.bucket,
            result_auth=AUTH_HMAC,
        )
        job = AttachedJob(handle, hook)
    found = OpenJob(job, _with_task(inventory.JobEntry(job.handle), index), index)
    if found.entry.dag_id is None and job.handle.group_id:
        # A child of a batch whose task record is gone: its batch's entry names the task
        # (what the page authorises by), exactly as the task showed it.
        parent = history.read(store, job.handle.group_id) or {}
        found.entry.dag_id, found.entry.run_id = parent.get("dag_id"), parent.get("run_id")
        found.entry.task_id = parent.get("task_id")
    return found


def _child_entry(store: ObjectStore, group_id: str, job_id: str) -> dict[str, Any] | None:
    """A history-like row for ``job_id`` when batch ``group_id``'s entry or manifest
    names it as a child (children have no entry of their own)."""
    parent = batch_entry(store, group_id)
    if parent is None or not is_child(store, parent, job_id):
        return None
    return {**parent, "job_id": job_id, "kind": "job", "group_id": group_id}


def output_prefix(store: ObjectStore, output_dir: str | None) -> str | None:
    """The store key of the job's output dir, when it lives in the connection's store
    (an output dir elsewhere is shown, not listed)."""
    if not output_dir:
        return None
    root = store.uri().rstrip("/") + "/"
    if not output_dir.startswith(root):
        return None
    prefix = output_dir[len(root) :].strip("/")
    if root.startswith("file://"):  # file:// URIs are percent-encoded; keys are not
        prefix = urllib.parse.unquote(prefix)
    return prefix + "/" if prefix else None


def detail(found: OpenJob) -> JobDetail:
    """Everything the job page shows besides the log."""
    job, store = found.job, found.job.store
    entry = history.read(store, job.job_id)
    row = _row(
        found.entry, history.settled(store, job.job_id, job.status(), entry), store, found.index
    )
    if entry is not None:
        row.ended = row.ended or entry.get("ended_at") or ""
    row.usage = usage_of(store, entry, load_price_table(strict=False), live=True)
    out = JobDetail(row, job.handle.output_dir, store.uri(f"{job.job_id}/"))
    out.usage_line = summary_line(row.usage) if row.usage else ""
    prefix = output_prefix(store, job.handle.output_dir)
    if prefix:
        objects = stat_objects(store, prefix)
        for key in sorted(objects)[:FILES_LIMIT]:
            out.files.append(OutputFile(key[len(prefix) :], objects[key][0]))
        out.files_truncated = len(objects) > FILES_LIMIT
    return out


def output_key(job: AttachedJob, name: str) -> str | None:
    """The store key of one output file by its listed name; None for a name that is
    not plainly inside the output dir (``..``, absolute, empty parts)."""
    return output_name_key(job.store, job.handle.output_dir, name)


def output_name_key(store: ObjectStore, output_dir: str | None, name: str) -> str | None:
    """:func:`output_key` of any output dir (a batch's, from its history entry)."""
    prefix = output_prefix(store, output_dir)
    parts = name.split("/")
    if not prefix or not name or any(p in ("", ".", "..") for p in parts):
        return None
    return prefix + name


def log_chunk(job: AttachedJob, offset: int) -> dict[str, object]:
    """New log text from ``offset``; the status is read first, so a reader that stops
    at a terminal status has every line (as ``AttachedJob.tail`` does)."""
    report = history.settled(job.store, job.job_id, job.status())
    text, next_offset = job.backend.read_logs(job.handle, max(0, offset))
    if not text and report.status.is_terminal and not job.backend.keeps_logs:
        kept = history.read_log(job.store, job.job_id) or ""  # the backend's copy went
        text, next_offset = (
            kept.encode()[max(0, offset) :].decode(errors="replace"),
            max(offset, len(kept.encode())),
        )
    last = read_progress(job.store, job.job_id)  # what its function reported, if anything
    return {
        "text": text,
        "offset": next_offset,
        "state": report.status.value,
        "reason": report.reason or "",
        "message": report.message or "",  # a waiting job's one line says why it waits
        "terminal": report.status.is_terminal,
        "progress": last.to_xcom() if last is not None else None,
    }


def batch_entry(store: ObjectStore, group_id: str) -> dict[str, Any] | None:
    """A batch's history entry (None: no such batch, or not a batch)."""
    entry = history.read(store, group_id)
    return entry if entry is not None and entry.get("kind") == "batch" else None


def is_child(store: ObjectStore, entry: dict[str, Any], job_id: str) -> bool:
    """Whether ``job_id`` is a job of the batch ``entry`` (its manifest or, once it
    ended, its history entry names it): the tab opens such a child's log by its
    batch after its own ``handle.json`` is gone."""
    if job_id in (entry.get("child_jobs") or ()):
        return True
    try:
        manifest = json.loads(store.read_bytes(manifest_key(str(entry["job_id"]))))
    except Exception:  # noqa: BLE001 - no manifest: not known as a child
        return False
    return any(c.get("job_id") == job_id for c in manifest.get("children") or ())
