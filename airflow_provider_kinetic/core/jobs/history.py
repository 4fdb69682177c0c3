"""Job history: what ran, where its output is and why it ended, after cleanup too.

Every job (and every batch, as one entry) has ``history/{job_id}/entry.json`` in the
store, written at submit and updated at each state change the waiting side observes; a
local job's log is archived beside it (``history/{job_id}/log.txt``) before the
backend's own copy goes.  The prefix is apart from the job's ``{job_id}/`` artifacts, so deleting
artifacts (the cleanup policy) never deletes history; only ``prune`` does, after
``[kinetic] history_retention_days``, and only when ``jobs cleanup`` asks.

History is for people (``jobs list``, ``jobs logs``, the Kinetic page): it is not
signed and nothing decides a try from it (the sealed task records do that).  A write
that fails is logged, never fatal: a job's result matters more than its history.
"""

from __future__ import annotations

import calendar
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

HISTORY_PREFIX = "history"
#: Default of ``[kinetic] history_retention_days``.
HISTORY_RETENTION_DAYS = 30.0
#: States of an entry: the backend's, plus the two only the waiting side knows.
SUBMITTED = "SUBMITTED"
CANCELLED = "CANCELLED"
ENDED = frozenset({"SUCCEEDED", "FAILED", CANCELLED, "NOT_FOUND", "PREEMPTED"})
#: At most this many state changes are kept per entry (the newest).
MAX_EVENTS = 50


ENTRY_NAME = "entry.json"
LOG_NAME = "log.txt"


def entry_key(job_id: str) -> str:
    return f"{HISTORY_PREFIX}/{job_id}/{ENTRY_NAME}"


def log_key(job_id: str) -> str:
    return f"{HISTORY_PREFIX}/{job_id}/{LOG_NAME}"


def now_iso(epoch: float | None = None) -> str:
    """``%Y-%m-%dT%H:%M:%SZ`` (kinetic's ``created_at`` form) of ``epoch`` (now)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if epoch is None else epoch))


def iso_epoch(text: Any) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _identity_fields(identity: Mapping[str, Any] | None) -> dict[str, Any]:
    identity = identity or {}
    return {
        "dag_id": identity.get("dag_id"),
        "task_id": identity.get("task_id"),
        "run_id": identity.get("run_id"),
        "map_index": identity.get("map_index", -1) if identity else None,
        "try_number": identity.get("try_number"),
        # As Airflow shows it (``task_identity``): ``jobs list`` and the Kinetic tab
        # show and filter by it; entries written before it was kept have none.
        "logical_date": identity.get("logical_date"),
    }


#: The data-cache entries a job reads (its handle's extra, copied here): ``data gc``
#: keeps them while the job's entry is in the history.
DATA_HASHES = "data_hashes"


def submitted(
    store: ObjectStore,
    job_id: str,
    identity: Mapping[str, Any] | None,
    *,
    backend: str,
    accelerator: str,
    func: str,
    output_dir: str | None,
    submitted_at: str = "",
    log_location: str | None = None,
    **extra: Any,
) -> None:
    """The entry of a job just created (``kind="job"``) or a batch just started
    (``kind="batch"`` in ``extra``, with ``total``)."""
    at = now_iso()
    entry = {
        "version": 1,
        "job_id": job_id,
        "kind": "job",
        **_identity_fields(identity),
        "backend": backend,
        "accelerator": accelerator,
        "func": func,
        "state": SUBMITTED,
        "reason": None,
        "submitted_at": submitted_at or at,
        "started_at": None,
        "ended_at": None,
        "updated_at": at,
        "output_dir": output_dir,
        "log": log_location,
        "artifacts": {"state": "present", "prefix": store.uri(f"{job_id}/")},
        "events": [{"at": at, "state": SUBMITTED}],
        **extra,
    }
    _write(store, job_id, entry)


def job_submitted(
    store: ObjectStore,
    handle: JobHandle,
    identity: Mapping[str, Any] | None,
    log_location: str | None = None,
) -> None:
    """:func:`submitted` for one job, from its handle."""
    submitted(
        store,
        handle.job_id,
        identity,
        backend=handle.backend,
        accelerator=handle.accelerator,
        func=handle.func_name,
        output_dir=handle.output_dir,
        submitted_at=handle.created_at,
        log_location=log_location,
        capacity=handle.capacity,  # absent (older handles): usage.capacity_of derives it
        **({"num_slices": handle.num_slices} if handle.num_slices else {}),
        **({DATA_HASHES: list(held)} if (held := handle.extra.get(DATA_HASHES)) else {}),
    )


def update(
    store: ObjectStore,
    job_id: str,
    state: str | None = None,
    reason: str | None = None,
    *,
    create: bool = True,
    **fields: Any,
) -> None:
    """Record a state change (only when the state or reason is new) and/or fields.

    An entry that is missing (a job submitted by an older version) is started here
    from what is known, so a job's end is never lost for want of its start; with
    ``create=False`` (a batch child, whose history is its batch's entry) it is not."""
    try:
        entry = read(store, job_id)
        if entry is None and not create:
            return
        entry = entry or {"version": 1, "job_id": job_id, "kind": "job"}
        at = now_iso()
        changed = False
        if state is not None and (state, reason) != (entry.get("state"), entry.get("reason")):
            entry["state"], entry["reason"] = state, reason
            events = entry.setdefault("events", [])
            events.append({"at": at, "state": state, **({"reason": reason} if reason else {})})
            del events[:-MAX_EVENTS]
            if state == "RUNNING" and not entry.get("started_at"):
                entry["started_at"] = at
            if state in ENDED and not entry.get("ended_at"):
                entry["ended_at"] = at
            changed = True
        for key, value in fields.items():
            if entry.get(key) != value:
                entry[key] = value
                changed = True
        if changed:
            entry["updated_at"] = at
            _write(store, job_id, entry, logged=False)
    except Exception as exc:  # noqa: BLE001 - history never fails a job
        log.warning("could not update the history of kinetic job %s: %s", job_id, exc)


def _write(store: ObjectStore, job_id: str, entry: dict[str, Any], logged: bool = True) -> None:
    try:
        store.write_bytes(
            entry_key(job_id),
            json.dumps(entry, indent=1, sort_keys=True, default=str).encode(),
            content_type="application/json",
        )
    except Exception as exc:
        if not logged:
            raise
        log.warning("could not write the history of kinetic job %s: %s", job_id, exc)


def read(store: ObjectStore, job_id: str) -> dict[str, Any] | None:
    """The entry of ``job_id`` (None: no history, or an unreadable entry)."""
    try:
        entry = json.loads(store.read_bytes(entry_key(job_id)))
    except ObjectNotFound:
        return None
    except ValueError as exc:
        log.warning("skipping %s: %s", store.uri(entry_key(job_id)), exc)
        return None
    return entry if isinstance(entry, dict) and entry.get("job_id") == job_id else None


def ended_report(entry: Mapping[str, Any] | None) -> StatusReport | None:
    """How an entry says its job ended, as a backend would report it (None: it has not
    ended, or nobody saw how).  For a job whose backend state was released once its
    outcome was collected: its backend answers NOT_FOUND, its history knows."""
    state = (entry or {}).get("state")
    if state == "SUCCEEDED":
        return StatusReport(JobStatus.SUCCEEDED, (entry or {}).get("reason"))
    if state in ENDED and state != "NOT_FOUND":
        return StatusReport(JobStatus.FAILED, (entry or {}).get("reason") or str(state).lower())
    return None


def settled(
    store: ObjectStore, job_id: str, report: StatusReport, entry: Mapping[str, Any] | None = None
) -> StatusReport:
    """``report``, unless its backend no longer knows the job (NOT_FOUND: its state was
    released once its outcome was collected) and the history says how it ended
    (``entry``: the job's entry when the caller has read it)."""
    if report.status is not JobStatus.NOT_FOUND:
        return report
    return ended_report(entry if entry is not None else read(store, job_id)) or report


def archive_log(store: ObjectStore, job_id: str, text: str, max_bytes: int) -> str | None:
    """Keep a job's log in the history (its last ``max_bytes``); the log's URI."""
    data = text.encode()
    if len(data) > max_bytes:
        cut = len(data) - max_bytes
        data = f"[kinetic] first {cut} bytes of this log not kept\n".encode() + data[cut:]
    try:
        store.write_bytes(log_key(job_id), data, content_type="text/plain")
    except Exception as exc:  # noqa: BLE001 - history never fails a job
        log.warning("could not keep the log of kinetic job %s: %s", job_id, exc)
        return None
    return store.uri(log_key(job_id))


def read_log(store: ObjectStore, job_id: str) -> str | None:
    try:
        return store.read_bytes(log_key(job_id)).decode(errors="replace")
    except ObjectNotFound:
        return None


@dataclass(frozen=True)
class Filter:
    """``jobs list`` filters; ``since`` is epoch seconds (submitted at or after)."""

    dag_id: str | None = None
    state: str | None = None
    since: float | None = None

    def __call__(self, entry: Mapping[str, Any]) -> bool:
        if self.dag_id is not None and entry.get("dag_id") != self.dag_id:
            return False
        if self.state is not None and str(entry.get("state", "")).upper() != self.state:
            return False
        if self.since is not None:
            at = iso_epoch(entry.get("submitted_at"))
            return at is not None and at >= self.since
        return True


def job_ids(store: ObjectStore) -> list[str]:
    """Ids with a history entry (jobs and batches)."""
    prefix, tail = HISTORY_PREFIX + "/", "/" + ENTRY_NAME
    return [
        key[len(prefix) : -len(tail)]
        for key in store.list(prefix)
        if key.endswith(tail) and key.count("/") == 2
    ]


def entries(store: ObjectStore, keep: Filter | None = None) -> list[dict[str, Any]]:
    """Every readable entry that ``keep`` accepts, newest submit first."""
    found = [e for job_id in job_ids(store) if (e := read(store, job_id)) is not None]
    if keep is not None:
        found = [e for e in found if keep(e)]
    found.sort(key=lambda e: (str(e.get("submitted_at") or ""), e["job_id"]), reverse=True)
    return found


def without_children(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``found`` less the entries of jobs a batch among them names as its children: a
    child's history is its batch's entry; a cancel used to give a cancelled child an
    entry of its own, with no task (a row without a DAG in ``jobs list`` and ``usage``)."""
    children = {
        str(child)
        for entry in found
        if entry.get("kind") == "batch"
        for child in entry.get("child_jobs") or ()
    }
    return [e for e in found if e.get("kind") == "batch" or e["job_id"] not in children]


def expired(found: Iterable[Mapping[str, Any]], older_than_s: float, now: float) -> list:
    """Entries of jobs that ended more than ``older_than_s`` ago (running ones never)."""
    out = []
    for entry in found:
        ended = iso_epoch(entry.get("ended_at"))
        if ended is not None and now - ended >= older_than_s:
            out.append(entry)
    return out


def remove(store: ObjectStore, job_id: str) -> int:
    """Delete one entry and its archived log; how many objects went."""
    return store.delete_prefix(f"{HISTORY_PREFIX}/{job_id}")
