"""``airflow kinetic jobs ...``: list, inspect, cancel and clean up jobs.

Jobs are operated through :func:`~airflow_provider_kinetic.attached.attach`, the same
path plain Python uses, so the CLI trusts a stored ``handle.json`` no further than
``attach`` does (job id and backend kind only; results must be signed).  The list
reads the store (``inventory``) and asks each job's backend through
:class:`JobStatuses`, which the plugin's Kinetic page shares.
"""

from __future__ import annotations

import calendar
import json
import pprint
import sys
import time
from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.attached import AttachedJob, attach
from airflow_provider_kinetic.cli import inventory
from airflow_provider_kinetic.cli.common import CliError, command, output_format
from airflow_provider_kinetic.cli.output import emit
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectNotFound
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.hooks.signing import deployment_secret


def _attach(args: Namespace) -> AttachedJob:
    """``args.job_id`` attached, or a :class:`CliError` naming the store it is not in."""
    try:
        return attach(args.job_id, conn_id=args.conn_id)
    except ObjectNotFound:
        store = KineticHook(args.conn_id).get_store()
        raise CliError(
            f"no kinetic job {args.job_id!r} in {store.uri()} (connection {args.conn_id!r})"
        ) from None


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
            if handle.backend not in self._backends:
                self._backends[handle.backend] = self.hook.get_backend(handle.backend)
            return self._backends[handle.backend].status(trusted)
        except Exception as exc:  # noqa: BLE001 - one unreachable job must not hide the rest
            return StatusReport(JobStatus.NOT_FOUND, "unknown", f"{type(exc).__name__}: {exc}")


#: States a history entry or a backend reports (``jobs list --state``).
STATES = (
    "SUBMITTED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED",
    "NOT_FOUND",
)  # fmt: skip

LIST_COLUMNS = (
    "job_id",
    "kind",
    "state",
    "reason",
    "dag_id",
    "task_id",
    "run_id",
    "accelerator",
    "submitted_at",
    "ended_at",
)


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


def _entry_row(entry: dict[str, Any]) -> dict[str, Any]:
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
    }


def _legacy_row(entry: inventory.JobEntry) -> dict[str, Any]:
    """A job with a ``handle.json`` but no history entry (submitted by an older version)."""
    h = entry.handle
    return {
        **dict.fromkeys(("reason", "started_at", "ended_at", "log", "children")),
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


def history_rows(statuses: JobStatuses, keep: history.Filter) -> list[dict[str, Any]]:
    """Every job the store's history knows (and older jobs known only by their
    ``handle.json``), newest first; a job whose entry has not ended shows what its
    backend says now.  ``keep.state`` is applied to that live state."""
    store = statuses.store
    index = inventory.task_index(store, deployment_secret())
    rows = [_with_task(_entry_row(e), index) for e in history.entries(store)]
    known = {row["job_id"] for row in rows}
    for entry in inventory.list_jobs(store, deployment_secret(), index):
        if entry.handle.job_id not in known and entry.handle.group_id not in known:
            rows.append(_legacy_row(entry))
    wanted = history.Filter(keep.dag_id, None, keep.since)
    rows = [row for row in rows if wanted(row)]
    for row in rows:
        if row["kind"] == "job" and row["state"] not in history.ENDED:
            handle = JobHandle(job_id=row["job_id"], backend=row["backend"] or "local",
                               bucket_name=store.bucket)  # fmt: skip
            report = statuses(handle)
            if report is not None:
                row["state"], row["reason"] = report.status.value, report.reason
            if report is not None and report.status.is_terminal and not row["ended_at"]:
                # Nobody waiting recorded its end: its last write to the store is it.
                row["ended_at"] = inventory.last_write(store, row["job_id"])
    if keep.state:
        rows = [row for row in rows if row["state"] == keep.state]
    rows.sort(key=lambda r: (str(r["submitted_at"] or ""), r["job_id"]), reverse=True)
    return rows


@command
def jobs_list(args: Namespace) -> None:
    """Jobs from the store's history (outlives cleanup), newest first."""
    want = args.state.upper() if args.state else None
    if want and want not in STATES:
        raise CliError(f"unknown state {args.state!r}; one of {', '.join(STATES)}")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be at least 1, got {args.limit}")
    since = parse_since(args.since, time.time()) if getattr(args, "since", None) else None
    statuses = JobStatuses(KineticHook(args.conn_id))
    rows = history_rows(statuses, history.Filter(args.dag_id, want, since))
    if args.limit:
        rows = rows[: args.limit]
    emit(rows, output_format(args), LIST_COLUMNS)


@command
def jobs_status(args: Namespace) -> None:
    """One job: its state (with the reason a person acts on) and where it lives; from
    the history once its artifacts are gone."""
    try:
        job = _attach(args)
    except CliError:
        entry = history.read(KineticHook(args.conn_id).get_store(), args.job_id)
        if entry is None:
            raise
        emit(_entry_row(entry), output_format(args))
        return
    report = job.status()
    h = job.handle
    emit(
        {
            "job_id": h.job_id,
            "state": report.status.value,
            "reason": report.reason,
            "message": report.message,
            "backend": h.backend,
            "func": h.func_name,
            "accelerator": h.accelerator,
            "created_at": h.created_at,
            "group_id": h.group_id,
            "group_index": h.group_index,
            "output_dir": h.output_dir,
            "artifacts": job.store.uri(f"{h.job_id}/"),
        },
        output_format(args),
    )


@command
def jobs_logs(args: Namespace) -> None:
    """The job's log; with ``--follow``, new lines until the job ends."""
    as_json = output_format(args) == "json"
    try:
        job = _attach(args)
    except CliError:
        job = None  # its artifacts are gone: the history may still hold its log
    if job is None or (not args.follow and not (text := job.logs())):
        text = _history_log(args)
        if as_json:
            print(json.dumps({"job_id": args.job_id, "logs": text}, indent=2))
        else:
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        return
    if not args.follow:
        if as_json:
            print(json.dumps({"job_id": job.job_id, "logs": text}, indent=2))
        else:
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        return
    for line in job.tail(follow=True, poll_interval=args.poll_interval):
        print(json.dumps({"job_id": job.job_id, "line": line}) if as_json else line, flush=True)


def _history_log(args: Namespace) -> str:
    """A job's log from the history (kept when the backend's own copy went), or where
    its backend keeps it; a CliError when the store knows nothing of the job."""
    store = KineticHook(args.conn_id).get_store()
    text = history.read_log(store, args.job_id)
    if text is not None:
        return text
    entry = history.read(store, args.job_id)
    if entry is None:
        raise CliError(f"no kinetic job {args.job_id!r} in {store.uri()} (connection "
                       f"{args.conn_id!r})")  # fmt: skip
    if entry.get("log"):
        return f"[kinetic] the log of {args.job_id} is kept by its backend: {entry['log']}\n"
    return ""


def failure_text(job_id: str, exc: BaseException) -> str:
    """What ``jobs result`` prints for a failed job: the remote type and message, then
    the exception's notes (the kinetic phase, the remote traceback).  An exception
    that could not be rebuilt here is named by its remote type, not by the
    ``RemoteFunctionError`` that carries it."""
    remote_type = getattr(exc, "remote_type", None)
    head = str(exc) if remote_type else f"{type(exc).__name__}: {exc}"
    notes = [str(n).rstrip() for n in getattr(exc, "__notes__", ())]
    return "\n".join([f"kinetic job {job_id} failed: {head}".rstrip(), *notes])


@command
def jobs_result(args: Namespace) -> None:
    """The job's return value (verified against its signature before it is unpickled)."""
    job = _attach(args)
    report = job.status()
    if not report.status.is_terminal and not args.wait:
        raise CliError(f"kinetic job {job.job_id} is still {report.status.value}: pass --wait")
    try:
        value = job.result(timeout=args.timeout, poll_interval=0.5)
    except TimeoutError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the remote exception, re-raised here
        raise CliError(failure_text(job.job_id, exc)) from None
    if output_format(args) == "json":
        try:
            print(json.dumps({"job_id": job.job_id, "value": value}, indent=2))
        except (TypeError, ValueError):
            out = {"job_id": job.job_id, "type": type(value).__name__, "repr": repr(value)}
            print(json.dumps(out, indent=2))
    else:
        print(value if isinstance(value, str) else pprint.pformat(value))


@command
def jobs_cancel(args: Namespace) -> None:
    """Stop a job; no later try of its task adopts it (the cancel marker goes first)."""
    job = _attach(args)
    before = job.status()
    requested = not before.status.is_terminal
    if requested:
        job.cancel()
    after = job.status() if requested else before
    if requested:  # the local backend ends the process at once; clusters take a moment
        deadline = time.monotonic() + args.wait_s
        while not after.status.is_terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            after = job.status()
    emit(
        {
            "job_id": job.job_id,
            "cancel_requested": requested,
            "state": after.status.value,
            "reason": after.reason,
        },
        output_format(args),
    )
