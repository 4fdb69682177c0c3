"""``airflow kinetic jobs cleanup``: delete what the cleanup policy says may go.

Three forms, each printing what it deleted (or, with ``--dry-run``, would delete)
with sizes, never silently:

- ``jobs cleanup JOB``: one finished job's artifacts and cluster objects;
- ``jobs cleanup --older-than AGE``: every finished job submitted longer ago;
- ``jobs cleanup`` alone: the retention the policy promises: artifacts of jobs that
  failed more than ``[kinetic] failed_retention_days`` ago, and history entries of
  jobs that ended more than ``[kinetic] history_retention_days`` ago, and checkpoints
  (``core.jobs.checkpoint``) not written for ``failed_retention_days``.

Artifacts that an XCom still needs (``cli.xcomrefs``: a handle a waiting sensor
reads, a result reference of a recent run) are kept unless ``--force``.  History is
deleted only by its own retention, never with artifacts.
"""

from __future__ import annotations

import time
from argparse import Namespace
from typing import Any

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.attached import attach
from airflow_provider_kinetic.cli import inventory, xcomrefs
from airflow_provider_kinetic.cli.common import CliError, command, output_format
from airflow_provider_kinetic.cli.output import emit, human_bytes
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import stale_checkpoints
from airflow_provider_kinetic.core.jobs.cleanup import FAILED_RETENTION_DAYS, left_behind
from airflow_provider_kinetic.core.spec.handles import StatusReport
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.hooks.kinetic import KineticHook

DAY = 86400.0
COLUMNS = ("what", "job_id", "state", "ended_at", "objects", "size", "action")


def retention_days(option: str, default: float) -> float:
    """``[kinetic] {option}`` in days (a negative or non-number value names itself)."""
    value = conf.getfloat("kinetic", option, fallback=default)
    if value < 0:
        raise CliError(f"[kinetic] {option} = {value}: must be 0 or more days")
    return value


def _row(what: str, job_id: str, entry: dict | None, left: dict, action: str) -> dict:
    return {
        "what": what,
        "job_id": job_id,
        "state": (entry or {}).get("state"),
        "ended_at": (entry or {}).get("ended_at"),
        "objects": left["objects"],
        "bytes": left["bytes"],
        "size": human_bytes(left["bytes"]),
        "action": action,
    }


class Cleaner:
    """One run of the command: the store, what XComs need, dry run or not."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.hook = KineticHook(args.conn_id)
        self.store: ObjectStore = self.hook.get_store()
        self.now = time.time()
        keep_s = retention_days("history_retention_days", history.HISTORY_RETENTION_DAYS) * DAY
        self.needed = xcomrefs.Needed() if args.force else xcomrefs.needed(keep_s, self.now)
        self.rows: list[dict[str, Any]] = []

    def artifacts(self, job_id: str, entry: dict | None, group_id: str | None = None) -> None:
        """Delete one ended job's artifacts (and cluster object), unless needed."""
        left = left_behind(self.store, job_id)
        if not left["objects"]:
            return
        why = self.needed.why(job_id, group_id or (entry or {}).get("group_id"))
        if why:
            self.rows.append(_row("artifacts", job_id, entry, left, f"kept: {why} (--force)"))
            return
        if self.args.dry_run:
            self.rows.append(_row("artifacts", job_id, entry, left, "would delete"))
            return
        try:
            attach(job_id, conn_id=self.args.conn_id).cleanup()
        except ObjectNotFound:  # no handle.json: nothing on the cluster to name
            self.store.delete_prefix(f"{job_id}/")
        done = {"state": "deleted by jobs cleanup", "objects": 0, "bytes": 0}
        history.update(self.store, job_id, create=False, artifacts=done)
        self.rows.append(_row("artifacts", job_id, entry, left, "deleted"))

    def history(self, entry: dict) -> None:
        """Delete one expired history entry (a batch's children's logs with it)."""
        ids = [entry["job_id"], *entry.get("child_jobs", [])]
        left = {"objects": 0, "bytes": 0}
        for job_id in ids:
            here = left_behind(self.store, f"{history.HISTORY_PREFIX}/{job_id}")
            left = {k: left[k] + here[k] for k in left}
        if not self.args.dry_run:
            for job_id in ids:
                history.remove(self.store, job_id)
        action = "would delete" if self.args.dry_run else "deleted"
        self.rows.append(_row("history", entry["job_id"], entry, left, action))


def _status(job_id: str, conn_id: str) -> StatusReport | None:
    """What the job's backend says now (None: no ``handle.json`` to ask with)."""
    try:
        return attach(job_id, conn_id=conn_id).status()
    except ObjectNotFound:
        return None


def _ended(cleaner: Cleaner, job_id: str, report: StatusReport | None) -> dict | None:
    """The job's history entry, with the end its backend reports when nobody waiting
    for it recorded one (a job submitted from plain Python, say)."""
    entry = history.read(cleaner.store, job_id)
    if report is not None and entry is not None and entry.get("state") not in history.ENDED:
        if not cleaner.args.dry_run:
            history.update(cleaner.store, job_id, report.status.value, report.reason)
        entry = history.read(cleaner.store, job_id) or entry
    return entry


def _one(cleaner: Cleaner, job_id: str) -> None:
    report = _status(job_id, cleaner.args.conn_id)
    if report is not None and not report.status.is_terminal:
        raise CliError(f"kinetic job {job_id} is still {report.status.value}: cancel it first")
    entry = _ended(cleaner, job_id, report)
    if entry is None and not left_behind(cleaner.store, job_id)["objects"]:
        raise CliError(f"no kinetic job {job_id!r} in {cleaner.store.uri()}")
    cleaner.artifacts(job_id, entry)


def _older_than(cleaner: Cleaner, age_s: float) -> None:
    cutoff = cleaner.now - age_s
    for job_id in inventory.job_ids(cleaner.store):
        handle = inventory.read_handle(cleaner.store, job_id)
        created = inventory.created_epoch(handle) if handle else None
        if created is None or created >= cutoff:
            continue
        report = _status(job_id, cleaner.args.conn_id)
        if report is not None and not report.status.is_terminal:
            left = left_behind(cleaner.store, job_id)
            entry = history.read(cleaner.store, job_id)
            action = f"skipped ({report.status.value})"
            cleaner.rows.append(_row("artifacts", job_id, entry, left, action))
            continue
        entry = _ended(cleaner, job_id, report)
        cleaner.artifacts(job_id, entry, handle.group_id if handle else None)


def _retention(cleaner: Cleaner) -> None:
    failed_s = retention_days("failed_retention_days", FAILED_RETENTION_DAYS) * DAY
    keep_s = retention_days("history_retention_days", history.HISTORY_RETENTION_DAYS) * DAY
    entries = history.entries(cleaner.store)
    for entry in history.expired(entries, failed_s, cleaner.now):
        if entry.get("kind") == "batch":  # the children that did not succeed
            for job_id in entry.get("failed_jobs", []):
                cleaner.artifacts(job_id, None, entry["job_id"])
        elif entry.get("state") != "SUCCEEDED":  # a succeeded job follows its policy
            cleaner.artifacts(entry["job_id"], entry)
    for entry in history.expired(entries, keep_s, cleaner.now):
        cleaner.history(entry)
    for prefix, objects, size in stale_checkpoints(cleaner.store, failed_s, cleaner.now):
        if not cleaner.args.dry_run:
            cleaner.store.delete_prefix(prefix)
        action = "would delete" if cleaner.args.dry_run else "deleted"
        left = {"objects": objects, "bytes": size}
        cleaner.rows.append(_row("checkpoints", cleaner.store.uri(prefix), None, left, action))


@command
def jobs_cleanup(args: Namespace) -> None:
    """Delete ended jobs' artifacts and cluster objects, and expired history."""
    if args.job_id and args.older_than:
        raise CliError("give either a JOB id or --older-than AGE (not both)")
    age_s = inventory.parse_age(args.older_than) if args.older_than else None
    cleaner = Cleaner(args)
    if args.job_id:
        _one(cleaner, args.job_id)
    elif age_s is not None:
        _older_than(cleaner, age_s)
    else:
        _retention(cleaner)
    emit(cleaner.rows, output_format(args), COLUMNS)
