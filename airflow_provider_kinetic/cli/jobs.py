"""``airflow kinetic jobs ...``: list, inspect, cancel and clean up jobs.

Jobs are operated through :func:`~airflow_provider_kinetic.attached.attach`, the same
path plain Python uses, so the CLI trusts a stored ``handle.json`` no further than
``attach`` does (job id and backend kind only; results must be signed).  The list's
rows, filters and batch children are ``joblist``, which the plugin's Kinetic pages
share.
"""

from __future__ import annotations

import json
import pprint
import sys
import time
from argparse import Namespace

from airflow_provider_kinetic.attached import AttachedJob, attach
from airflow_provider_kinetic.cli.common import CliError, command, output_format
from airflow_provider_kinetic.cli.joblist import (
    CHILD_COLUMNS,
    LIST_COLUMNS,
    STATES,
    JobStatuses,
    TaskFilter,
    child_rows,
    entry_row,
    history_rows,
    parse_logical_date,
    parse_since,
    result_fate,
)
from airflow_provider_kinetic.cli.output import emit
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.finish import failure_of
from airflow_provider_kinetic.core.spec.failure import Failure
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectNotFound
from airflow_provider_kinetic.deployment.signing import result_key
from airflow_provider_kinetic.hooks.kinetic import KineticHook


def _attach(args: Namespace) -> AttachedJob:
    """``args.job_id`` attached, or a :class:`CliError` naming the store it is not in."""
    try:
        return attach(args.job_id, conn_id=args.conn_id)
    except ObjectNotFound:
        store = KineticHook(args.conn_id).get_store()
        raise CliError(
            f"no kinetic job {args.job_id!r} in {store.uri()} (connection {args.conn_id!r})"
        ) from None


@command
def jobs_list(args: Namespace) -> None:
    """Jobs from the store's history (outlives cleanup), newest first."""
    want = args.state.upper() if args.state else None
    if want and want not in STATES:
        raise CliError(f"unknown state {args.state!r}; one of {', '.join(STATES)}")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be at least 1, got {args.limit}")
    since = parse_since(args.since, time.time()) if getattr(args, "since", None) else None
    logical = getattr(args, "logical_date", None)
    match = TaskFilter(
        run_id=getattr(args, "run_id", None),
        logical_date=parse_logical_date(logical) if logical else None,
        map_index=getattr(args, "map_index", None),
    )
    statuses = JobStatuses(KineticHook(args.conn_id))
    rows = history_rows(statuses, history.Filter(args.dag_id, want, since), match)
    if args.limit:
        rows = rows[: args.limit]
    if not getattr(args, "children", False):
        emit(rows, output_format(args), LIST_COLUMNS)
        return
    expanded = []
    for row in rows:
        expanded.append({**row, "child": None})
        if row["kind"] == "batch":
            expanded += child_rows(statuses, row)
    emit(expanded, output_format(args), CHILD_COLUMNS)


def _attach_or_history(args: Namespace) -> tuple[AttachedJob | None, dict]:
    """The job attached, or (None, its history entry) once its artifacts are gone; the
    attach error when neither knows it."""
    try:
        return _attach(args), {}
    except CliError:
        entry = history.read(KineticHook(args.conn_id).get_store(), args.job_id)
        if entry is None:
            raise
        return None, entry


@command
def jobs_status(args: Namespace) -> None:
    """One job: its state (with the reason a person acts on) and where it lives; from
    the history once its artifacts are gone."""
    job, entry = _attach_or_history(args)
    if job is None:
        emit(entry_row(entry), output_format(args))
        return
    report = job.status()  # a job its backend released: how its history says it ended
    h = job.handle
    entry = history.read(job.store, h.job_id)
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
            "try_number": (entry or {}).get("try_number"),
            "result": result_fate(entry) if entry and report.status.is_terminal else None,
            "failure": _failure(job, report, entry),
        },
        output_format(args),
    )


def _failure(job: AttachedJob, report: StatusReport, entry: dict | None) -> str | None:
    """What failed (``core.spec.failure``): as the task that finished the job recorded
    it, else read from its failure payload and status now; None for a job that did not
    fail."""
    recorded = (entry or {}).get("failure")
    if isinstance(recorded, dict) and recorded.get("class"):
        return Failure.from_dict(recorded).describe()
    if report.status is not JobStatus.FAILED:
        return None
    failure = failure_of(job.store, job.handle, report, result_key(job.handle))
    return failure.describe() if failure is not None else None


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
        raise CliError(
            f"no kinetic job {args.job_id!r} in {store.uri()} (connection {args.conn_id!r})"
        )
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
    """The job's return value (verified against its signature before it is unpickled);
    a job whose artifacts are gone: what its history says became of its result."""
    job, entry = _attach_or_history(args)
    if job is None:
        raise CliError(f"kinetic job {args.job_id}: {result_fate(entry)}")
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
