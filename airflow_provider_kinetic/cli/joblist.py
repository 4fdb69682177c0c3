"""What ``jobs list`` shows: history rows with live states, filters, batch children.

Shared by the CLI's list and the plugin's Kinetic pages (the jobs list and the task
instance tab), so both show the same rows with the same exact ids: run id, logical
date and map index come verbatim from the history entry (``task_identity``), never
from a store key (keys escape unsafe characters, ``core.spec.identity``).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.cli import inventory
from airflow_provider_kinetic.cli.common import CliError
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.batch.manifest import manifest_key
from airflow_provider_kinetic.core.batch.resume import live_key
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.signing import unseal
from airflow_provider_kinetic.core.spec.failure import Failure
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectNotFound
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.hooks.kinetic import KineticHook


class JobStatuses:
    """Status of stored handles, normalised as ``attach`` does: the object name,
    namespace and bucket come from the connection, not from ``handle.json``.
    Shared by the CLI's job list and the plugin's Kinetic page."""

    def __init__(self, hook: KineticHook) -> None:
        self.hook = hook
        self.config = hook.get_config()
        self.store = hook.get_store()
        self._backends: dict[str, Backend] = {}

    def __call__(self, handle: JobHandle) -> StatusReport | None:
        try:
            kind = backend_class(handle.backend)
            trusted = handle.evolve(
                k8s_name=kind.object_name(handle.job_id),
                namespace=self.config.namespace,
                bucket_name=self.store.bucket,
            )
            return self._backend(handle.backend).status(trusted)
        except Exception as exc:  # noqa: BLE001 - one unreachable job must not hide the rest
            return StatusReport(JobStatus.NOT_FOUND, "unknown", f"{type(exc).__name__}: {exc}")

    def _backend(self, kind: str) -> Backend:
        if kind not in self._backends:
            self._backends[kind] = self.hook.get_backend(kind)
        return self._backends[kind]

    def batch(self, group_id: str, handles: list[JobHandle]) -> dict[str, StatusReport]:
        """Many children of one batch in one backend query (normalised as above); an
        unreachable backend leaves them unknown (empty), never an error."""
        if not handles:
            return {}
        try:
            kind = backend_class(handles[0].backend)
            trusted = [
                h.evolve(
                    k8s_name=kind.object_name(h.job_id),
                    namespace=self.config.namespace,
                    bucket_name=self.store.bucket,
                )
                for h in handles
            ]
            return self._backend(handles[0].backend).batch_status(group_id, trusted)
        except Exception:  # noqa: BLE001 - the page and the list still show the rest
            return {}


#: States a history entry or a backend reports (``jobs list --state``).
STATES = (
    "SUBMITTED",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "PREEMPTED",
    "NOT_FOUND",
)

LIST_COLUMNS = (
    "job_id",
    "kind",
    "state",
    "reason",
    "dag_id",
    "task_id",
    "run_id",
    "logical_date",
    "map_index",
    "accelerator",
    "submitted_at",
    "ended_at",
)
#: With ``--children``: a batch's children follow its row, each with its input index.
CHILD_COLUMNS = (*LIST_COLUMNS[:9], "child", *LIST_COLUMNS[9:])


@dataclass(frozen=True)
class TaskFilter:
    """``jobs list --run-id / --logical-date / --map-index`` (and the Kinetic tab's
    task): exact ids as Airflow shows them, kept verbatim in the history entry.
    ``logical_date`` is a prefix of the ISO date (``2026-11-21``, ``2026-11-21T06``);
    ``Z`` stands for ``+00:00``, as Airflow writes UTC."""

    run_id: str | None = None
    logical_date: str | None = None
    map_index: int | None = None
    task_id: str | None = None

    def __call__(self, row: Mapping[str, Any]) -> bool:
        if self.run_id is not None and row.get("run_id") != self.run_id:
            return False
        if self.task_id is not None and row.get("task_id") != self.task_id:
            return False
        if self.map_index is not None and str(row.get("map_index")) != str(self.map_index):
            return False
        if self.logical_date is not None:
            shown = str(row.get("logical_date") or "")
            return bool(shown) and _iso_form(shown).startswith(_iso_form(self.logical_date))
        return True


def _iso_form(text: str) -> str:
    text = text.strip().replace(" ", "T", 1)
    return text[:-1] + "+00:00" if text.endswith("Z") else text


def parse_logical_date(text: str) -> str:
    """``--logical-date``: a date or a prefix of an ISO date-time, checked."""
    if not re.fullmatch(r"\d{4}(-\d\d(-\d\d([T ][0-9:.+Z-]*)?)?)?", text.strip()):
        raise CliError(
            f"--logical-date {text!r}: expected a date (2026-11-21) or the start of an ISO "
            "date-time (2026-11-21T06:00, 2026-11-21T06:00:00+00:00)"
        )
    return text.strip()


def parse_since(text: str, now: float) -> float:
    """``--since``: an age (``7d``) or a UTC date (``2026-11-24[T06:00:00Z]``) -> epoch."""
    try:
        return now - inventory.parse_age(text)
    except inventory.BadAge:
        pass
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d"):
        try:
            return float(calendar.timegm(time.strptime(text.strip(), fmt)))
        except ValueError:
            continue
    raise CliError(
        f"--since {text!r}: expected an age (45s, 30m, 12h, 7d) or a UTC date "
        "(2026-11-24 or 2026-11-24T06:00:00Z)"
    )


def _task_name(entry: Mapping[str, Any]) -> str:
    """``dag/run/task[map]`` of an entry, as Airflow names the task instance."""
    name = f"{entry.get('dag_id')}/{entry.get('run_id')}/{entry.get('task_id')}"
    index = entry.get("map_index")
    return name + (f"[{index}]" if index not in (None, -1) else "")


def result_fate(entry: Mapping[str, Any]) -> str:
    """What became of a job's (or batch's) result, from its history entry: for a job
    its backend no longer knows (``jobs status``, ``jobs result``), e.g. ``delivered
    to XCom of dag/run/task (try 2) and deleted by cleanup on_success``."""
    state = str(entry.get("state") or history.SUBMITTED)
    artifacts = entry.get("artifacts") or {}
    kept = str(artifacts.get("state") or "present")
    policy = artifacts.get("policy")
    if kept == "deleted":
        gone = f"deleted by cleanup {policy}" if policy else "deleted"
    elif kept.startswith("deleted"):
        gone = kept
    else:
        gone = f"its artifacts {kept}"
    if state not in history.ENDED:
        return f"not ended ({state}): no result yet"
    if state == "SUCCEEDED":
        if entry.get("dag_id"):
            where = f"XCom of {_task_name(entry)}"
            if entry.get("try_number") is not None:
                where += f" (try {entry['try_number']})"
        else:
            where = "its caller"
        return (
            f"delivered to {where} and {gone}"
            if gone.startswith("deleted")
            else (f"delivered to {where}; {gone}")
        )
    why = f" ({entry['reason']})" if entry.get("reason") else ""
    return f"no value: it ended {state}{why}; " + (
        f"its artifacts {gone}" if gone.startswith("deleted") else gone
    )


def entry_row(entry: dict[str, Any]) -> dict[str, Any]:
    artifacts = entry.get("artifacts") or {}
    return {
        "job_id": entry["job_id"],
        "kind": entry.get("kind", "job"),
        "state": entry.get("state"),
        "reason": entry.get("reason"),
        "dag_id": entry.get("dag_id"),
        "task_id": entry.get("task_id"),
        "run_id": entry.get("run_id"),
        "map_index": entry.get("map_index"),
        "logical_date": entry.get("logical_date"),
        "try_number": entry.get("try_number"),
        "group_id": entry.get("group_id"),
        "func": entry.get("func"),
        "accelerator": entry.get("accelerator"),
        "backend": entry.get("backend"),
        "submitted_at": entry.get("submitted_at"),
        "started_at": entry.get("started_at"),
        "ended_at": entry.get("ended_at"),
        "output_dir": entry.get("output_dir"),
        "log": entry.get("log"),
        "artifacts": artifacts.get("state"),
        "artifacts_bytes": artifacts.get("bytes"),
        "children": entry.get("children"),
        "result": result_fate(entry),
        "failure": _failure_line(entry.get("failure")),
    }


def _failure_line(recorded: Any) -> str | None:
    """The failure line a task recorded in the entry (``core.spec.failure``), or None."""
    if not isinstance(recorded, dict) or not recorded.get("class"):
        return None
    try:
        return Failure.from_dict(recorded).describe()
    except (TypeError, ValueError):  # an entry from another version
        return None


def _legacy_row(entry: inventory.JobEntry) -> dict[str, Any]:
    """A job with a ``handle.json`` but no history entry (submitted by an older version)."""
    h = entry.handle
    return {
        **dict.fromkeys(
            ("reason", "started_at", "ended_at", "log", "children", "logical_date", "result")
        ),
        "job_id": h.job_id,
        "kind": "job",
        "state": None,
        "dag_id": entry.dag_id,
        "task_id": entry.task_id,
        "run_id": entry.run_id,
        "map_index": entry.map_index,
        "try_number": None,
        "group_id": h.group_id,
        "func": h.func_name,
        "accelerator": h.accelerator,
        "backend": h.backend,
        "submitted_at": h.created_at,
        "output_dir": h.output_dir,
        "artifacts": "present",
        "artifacts_bytes": None,
    }


def _with_task(row: dict[str, Any], index: inventory.TaskIndex) -> dict[str, Any]:
    """A job submitted outside a task's own identity (``attach``, plain Python) gets
    the task a sealed record names, else the DAG of its default output dir."""
    if row["dag_id"] is None:
        found = index.by_job.get(row["job_id"]) or index.by_group.get(row["job_id"])
        if found is not None:
            row["dag_id"], row["run_id"], row["task_id"], row["map_index"] = found
        else:
            row["dag_id"] = inventory.dag_from_output_dir(row["output_dir"])
    return row


def history_rows(
    statuses: JobStatuses,
    keep: history.Filter,
    match: Callable[[Mapping[str, Any]], bool] | None = None,
    messages: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every job the store's history knows (and older jobs known only by their
    ``handle.json``), newest first; a job whose entry has not ended shows what its
    backend says now (its status line's message into ``messages``, by job id: why a
    waiting job waits).  ``keep.state`` is applied to that live state; ``match`` (a
    :class:`TaskFilter`) before any backend is asked."""
    store = statuses.store
    index = inventory.task_index(store, deployment_secret())
    found = history.without_children(history.entries(store))
    rows = [_with_task(entry_row(e), index) for e in found]
    known = {row["job_id"] for row in rows}
    for entry in inventory.list_jobs(store, deployment_secret(), index):
        if entry.handle.job_id not in known and entry.handle.group_id not in known:
            rows.append(_legacy_row(entry))
    wanted = history.Filter(keep.dag_id, None, keep.since)
    rows = [row for row in rows if wanted(row) and (match is None or match(row))]
    for row in rows:
        if row["kind"] == "job" and row["state"] not in history.ENDED:
            handle = JobHandle(
                job_id=row["job_id"], backend=row["backend"] or "local", bucket_name=store.bucket
            )
            report = statuses(handle)
            if report is not None:
                row["state"], row["reason"] = report.status.value, report.reason
                if messages is not None and report.message:
                    messages[row["job_id"]] = report.message
            if report is not None and report.status.is_terminal and not row["ended_at"]:
                # Nobody waiting recorded its end: its last write to the store is it.
                row["ended_at"] = inventory.last_write(store, row["job_id"])
    if keep.state:
        rows = [row for row in rows if row["state"] == keep.state]
    rows.sort(key=lambda r: (str(r["submitted_at"] or ""), r["job_id"]), reverse=True)
    return rows


def child_rows(statuses: JobStatuses, batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A batch's children (``jobs list --children``, the Kinetic tab), by input index:
    the job ids its manifest and its saved live state name (``core.batch``), each
    child's state from its backend in one ``batch_status`` call; a child its backend
    no longer knows (released once collected) from the batch's history entry.  The
    manifest is rewritten every ``MANIFEST_INTERVAL_S`` while inputs wait, so a child
    launched since may be missing until then."""
    store, group = statuses.store, str(batch["job_id"])
    jobs: dict[int, tuple[str, int | None]] = {}
    try:
        manifest = json.loads(store.read_bytes(manifest_key(group)))
    except (ObjectNotFound, ValueError):
        manifest = {}
    for child in manifest.get("children") or []:
        jobs[int(child["group_index"])] = (str(child["job_id"]), child.get("attempts"))
    try:  # newer than the manifest, when a sensor or a retry drives the batch
        live = unseal(deployment_secret(), store.read_bytes(live_key(group)), group)
    except Exception:  # noqa: BLE001 - absent or unreadable: the manifest is enough
        live = {}
    done = {int(k): v for k, v in (live.get("done") or {}).items()}
    for index, job_id in (live.get("jobs") or {}).items():
        jobs[int(index)] = (str(job_id), (live.get("attempts") or {}).get(index))
    entry = history.read(store, group) or {}
    failed, created = set(entry.get("failed_jobs") or ()), set(entry.get("child_jobs") or ())
    # How the batch saw each child end (``core.batch.finish``): once the batch ended,
    # the word on a child its backend no longer knows, or that it cancelled.
    recorded: dict[str, str] = {}
    for index, child in (entry.get("child_states") or {}).items():
        if isinstance(child, dict) and child.get("job_id"):
            recorded[str(child["job_id"])] = str(child.get("state"))
            jobs.setdefault(int(index), (str(child["job_id"]), None))
    ended = entry.get("state") in history.ENDED
    handles = [
        JobHandle(
            job_id=job_id,
            backend=batch.get("backend") or "local",
            bucket_name=store.bucket,
            group_id=group,
            group_index=index,
        )
        for index, (job_id, _) in sorted(jobs.items())
    ]
    reports = statuses.batch(group, handles)
    rows = []
    for handle in handles:
        index = int(handle.group_index or 0)
        report = reports.get(handle.job_id)
        state, reason = (report.status.value, report.reason) if report else ("NOT_FOUND", None)
        if handle.job_id in recorded and (ended or state == "NOT_FOUND"):
            if recorded[handle.job_id] != state:
                state, reason = recorded[handle.job_id], None
        elif state == "NOT_FOUND":
            if handle.job_id in failed:
                state = "FAILED"
            elif handle.job_id in created or done.get(index) == "SUCCEEDED":
                state, reason = "SUCCEEDED", None
            elif index in done:
                state = str(done[index])
        rows.append(
            {
                **{key: batch.get(key) for key in LIST_COLUMNS},
                "job_id": handle.job_id,
                "kind": "child",
                "state": state,
                "reason": reason,
                "child": index,
                "attempts": jobs[index][1],
                "group_id": group,
                "submitted_at": None,
                "ended_at": None,
            }
        )
    return rows
