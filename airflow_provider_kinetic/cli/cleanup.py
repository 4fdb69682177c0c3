"""``airflow kinetic jobs cleanup``: delete what the cleanup policy says may go.

Three forms, each printing what it deleted (or, with ``--dry-run``, would delete)
with sizes, never silently:

- ``jobs cleanup JOB``: one finished job's artifacts and cluster objects;
- ``jobs cleanup --older-than AGE``: every finished job submitted longer ago;
- ``jobs cleanup`` alone: the retention the policy promises: artifacts of jobs that
  failed more than ``[kinetic] failed_retention_days`` ago, and history entries of
  jobs that ended more than ``[kinetic] history_retention_days`` ago, and checkpoints
  (``core.jobs.checkpoint``) not written for ``failed_retention_days``.

Nothing is deleted that something holds (``core.jobs.holds.decide``): a running job or
batch (always), an XCom (``cli.xcomrefs``: a handle a waiting sensor reads, a result
reference of a recent run) and a batch that failed as a whole within
``failed_retention_days`` (its succeeded children: a retry resumes it) unless
``--force``; each kept row says what holds it (``held_by``).  The retention and
``--older-than`` forms also delete artifact dirs no job was made from (no
``handle.json``, no history entry: a submit killed between upload and create), after
an hour at least.  History is deleted only by its own retention, never with artifacts.
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
from airflow_provider_kinetic.core.jobs import history, resultcache
from airflow_provider_kinetic.core.jobs.checkpoint import stale_checkpoints
from airflow_provider_kinetic.core.jobs.cleanup import FAILED_RETENTION_DAYS, left_behind
from airflow_provider_kinetic.core.jobs.holds import (
    ARTIFACTS,
    BATCH,
    CHECKPOINTS,
    SUCCEEDED_CHILDREN,
    Candidate,
    Holder,
    Holds,
    Ref,
    decide,
    held_by_text,
    store_holds,
)
from airflow_provider_kinetic.core.spec.handles import StatusReport
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.core.storage.stat import stat_objects
from airflow_provider_kinetic.hooks.kinetic import KineticHook

DAY = 86400.0
COLUMNS = ("what", "job_id", "state", "ended_at", "objects", "size", "action", "held_by")
#: An artifact dir with no ``handle.json`` younger than this may be a submit under way
#: (its payload uploaded, its job about to be created), whatever ``--older-than`` says.
ORPHAN_GRACE_S = 3600.0


def retention_days(option: str, default: float) -> float:
    """``[kinetic] {option}`` in days (a negative or non-number value names itself)."""
    value = conf.getfloat("kinetic", option, fallback=default)
    if value < 0:
        raise CliError(f"[kinetic] {option} = {value}: must be 0 or more days")
    return value


def _row(
    what: str,
    job_id: str,
    entry: dict | None,
    left: dict,
    action: str,
    held: list[Holder] | None = None,
) -> dict:
    return {
        "what": what,
        "job_id": job_id,
        "state": (entry or {}).get("state"),
        "ended_at": (entry or {}).get("ended_at"),
        "objects": left["objects"],
        "bytes": left["bytes"],
        "size": human_bytes(left["bytes"]),
        "action": action,
        "held_by": [str(h) for h in held or ()],
    }


class Cleaner:
    """One run of the command: the store, what XComs need, dry run or not."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.hook = KineticHook(args.conn_id)
        self.store: ObjectStore = self.hook.get_store()
        self.now = time.time()
        keep_s = retention_days("history_retention_days", history.HISTORY_RETENTION_DAYS) * DAY
        self.failed_s = retention_days("failed_retention_days", FAILED_RETENTION_DAYS) * DAY
        self.entries = history.entries(self.store)
        self.cache_s = (
            retention_days("cache_retention_days", resultcache.CACHE_RETENTION_DAYS) * DAY
        )
        # What still needs what (``core.jobs.holds``): the store's holders, and the XComs'
        # unless ``--force``, which also lets go of what a failed batch keeps for a
        # retry; a running job or batch holds its own whatever is asked.
        self.holds = store_holds(
            self.store, self.now, self.failed_s, self.entries, cache_retention_s=self.cache_s
        )
        if args.force:
            self.holds = Holds(
                {
                    ref: running
                    for ref, holders in self.holds.by_ref.items()
                    if (running := [h for h in holders if h.kind.startswith("running")])
                }
            )
        else:
            self.holds.merge(xcomrefs.needed(keep_s, self.now).holds())
        self.rows: list[dict[str, Any]] = []

    def held(self, ref: Ref, within: tuple[Ref, ...] = ()) -> list[Holder]:
        """What holds ``ref`` (``core.jobs.holds.decide``: the one question)."""
        return decide([Candidate(ref, within)], self.holds).held_by(ref)

    def artifacts(self, job_id: str, entry: dict | None, group_id: str | None = None) -> None:
        """Delete one ended job's artifacts (and cluster object), unless held."""
        left = left_behind(self.store, job_id)
        if not left["objects"]:
            return
        group = group_id or (entry or {}).get("group_id")
        held = self.held(Ref(ARTIFACTS, job_id), (Ref(BATCH, group),) if group else ())
        # Every caller saw this job end (its backend, or its entry): an entry that
        # still says it runs is one nobody updated (a job from plain Python).
        held = [h for h in held if h != Holder("running job", f"running job {job_id}")]
        if held:
            action = f"kept: {held_by_text(held)} (--force)"
            self.rows.append(_row("artifacts", job_id, entry, left, action, held))
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
    _orphans(cleaner, max(age_s, ORPHAN_GRACE_S))


def _orphans(cleaner: Cleaner, grace_s: float) -> None:
    """Artifact dirs no job was ever made from: no ``handle.json`` (written before a
    job is created), no history entry, not a child any batch names, nothing written
    for ``grace_s`` (a submit killed between its upload and its create leaves its
    ``payload.pkl``); deleted unless something (an XCom) holds them."""
    known = set(history.job_ids(cleaner.store))
    for entry in cleaner.entries:
        known.update(entry.get("child_jobs") or ())
        known.update(entry.get(SUCCEEDED_CHILDREN) or ())
    dirs: dict[str, list[tuple[str, int, float]]] = {}
    for key, (size, when) in stat_objects(cleaner.store, "job-").items():
        if key.count("/") >= 1:
            dirs.setdefault(key.split("/", 1)[0], []).append((key, size, when))
    for job_id, objects in sorted(dirs.items()):
        names = {key.split("/", 1)[1] for key, _, _ in objects}
        newest = max(when for _, _, when in objects)
        if job_id in known or inventory.HANDLE_NAME in names or cleaner.now - newest < grace_s:
            continue
        left = {"objects": len(objects), "bytes": sum(size for _, size, _ in objects)}
        held = cleaner.held(Ref(ARTIFACTS, job_id))
        if held:
            action = f"kept: {held_by_text(held)} (--force)"
        elif cleaner.args.dry_run:
            action = "would delete (no job, no history entry: a submit that never created it)"
        else:
            cleaner.store.delete_prefix(f"{job_id}/")
            action = "deleted (no job, no history entry: a submit that never created it)"
        cleaner.rows.append(_row("orphan artifacts", job_id, None, left, action, held))


def expire_cache(cleaner: Cleaner) -> None:
    """Cache entries past ``[kinetic] cache_retention_days`` go, and with them their
    jobs' artifacts unless something else holds them (within it they hold them)."""
    for entry in resultcache.entries(cleaner.store):
        if not entry.expired(cleaner.now, cleaner.cache_s):
            continue
        what = f"cache entry {entry.key[:12]}"
        job = history.read(cleaner.store, entry.job_id)
        none = {"objects": 0, "bytes": 0}
        if cleaner.args.dry_run:
            cleaner.rows.append(_row(what, entry.job_id, job, none, "would delete"))
        else:
            resultcache.remove(cleaner.store, entry.key)
            cleaner.rows.append(_row(what, entry.job_id, job, none, "deleted"))
        cleaner.artifacts(entry.job_id, job)


def _retention(cleaner: Cleaner) -> None:
    expire_cache(cleaner)
    failed_s = cleaner.failed_s
    keep_s = retention_days("history_retention_days", history.HISTORY_RETENTION_DAYS) * DAY
    entries = cleaner.entries
    for entry in history.expired(entries, failed_s, cleaner.now):
        if entry.get("kind") == "batch":  # the children that did not succeed
            for job_id in entry.get("failed_jobs", []):
                cleaner.artifacts(job_id, None, entry["job_id"])
        elif entry.get("state") != "SUCCEEDED":  # a succeeded job follows its policy
            cleaner.artifacts(entry["job_id"], entry)
    for entry in history.expired(entries, keep_s, cleaner.now):
        cleaner.history(entry)
    for prefix, objects, size in stale_checkpoints(cleaner.store, failed_s, cleaner.now):
        left = {"objects": objects, "bytes": size}
        held = cleaner.held(Ref(CHECKPOINTS, prefix))
        if held:
            action = f"kept: {held_by_text(held)}"
        elif cleaner.args.dry_run:
            action = "would delete"
        else:
            cleaner.store.delete_prefix(prefix)
            action = "deleted"
        uri = cleaner.store.uri(prefix)
        cleaner.rows.append(_row("checkpoints", uri, None, left, action, held))
    _orphans(cleaner, ORPHAN_GRACE_S)


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
    out = output_format(args)
    rows = cleaner.rows
    if out != "json":  # a table's cell: the holders in a few words
        rows = [{**r, "held_by": held_by_text(r["held_by"])} for r in rows]
    emit(rows, out, COLUMNS)
