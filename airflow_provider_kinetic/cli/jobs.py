"""``airflow kinetic jobs ...``: list, inspect, cancel and clean up jobs.

Jobs are operated through :func:`~airflow_provider_kinetic.attached.attach`, the same
path plain Python uses, so the CLI trusts a stored ``handle.json`` no further than
``attach`` does (job id and backend kind only; results must be signed).  The list
reads the store (``inventory``) and asks each job's backend through
:class:`JobStatuses`, which the plugin's Kinetic page shares.
"""

from __future__ import annotations

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


def _job_row(entry: inventory.JobEntry, report: StatusReport | None) -> dict[str, Any]:
    h = entry.handle
    return {
        "job_id": h.job_id,
        "state": report.status.value if report else None,
        "reason": report.reason if report else None,
        "dag_id": entry.dag_id,
        "task_id": entry.task_id,
        "run_id": entry.run_id,
        "map_index": entry.map_index,
        "group_id": h.group_id,
        "func": h.func_name,
        "accelerator": h.accelerator,
        "backend": h.backend,
        "created_at": h.created_at,
    }


LIST_COLUMNS = (
    "job_id",
    "state",
    "reason",
    "dag_id",
    "task_id",
    "func",
    "accelerator",
    "created_at",
)


@command
def jobs_list(args: Namespace) -> None:
    """Jobs in the connection's store, newest first."""
    hook = KineticHook(args.conn_id)
    status = JobStatuses(hook)
    want = args.state.upper() if args.state else None
    if want and want not in JobStatus.__members__:
        raise CliError(f"unknown state {args.state!r}; one of {', '.join(JobStatus.__members__)}")
    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be at least 1, got {args.limit}")
    rows = []
    for entry in inventory.list_jobs(status.store, deployment_secret()):
        if args.dag_id and entry.dag_id != args.dag_id:
            continue
        report = status(entry.handle)
        if want and (report is None or report.status.value != want):
            continue
        rows.append(_job_row(entry, report))
        if args.limit and len(rows) >= args.limit:
            break
    emit(rows, output_format(args), LIST_COLUMNS)


@command
def jobs_status(args: Namespace) -> None:
    """One job: its state (with the reason a person acts on) and where it lives."""
    job = _attach(args)
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
    job = _attach(args)
    as_json = output_format(args) == "json"
    if not args.follow:
        text = job.logs()
        if as_json:
            print(json.dumps({"job_id": job.job_id, "logs": text}, indent=2))
        else:
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        return
    for line in job.tail(follow=True, poll_interval=args.poll_interval):
        print(json.dumps({"job_id": job.job_id, "line": line}) if as_json else line, flush=True)


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


@command
def jobs_cleanup(args: Namespace) -> None:
    """Delete finished jobs' cluster objects and ``{job_id}/`` artifacts."""
    if bool(args.job_id) == bool(args.older_than):
        raise CliError("give either a JOB id or --older-than AGE (not both)")
    if args.job_id:
        targets = [args.job_id]
    else:
        cutoff = time.time() - inventory.parse_age(args.older_than)
        store = KineticHook(args.conn_id).get_store()
        targets = []
        for job_id in inventory.job_ids(store):
            handle = inventory.read_handle(store, job_id)
            created = inventory.created_epoch(handle) if handle else None
            if created is not None and created < cutoff:
                targets.append(job_id)
    rows = []
    for job_id in sorted(targets):
        job = attach(job_id, conn_id=args.conn_id) if not args.job_id else _attach(args)
        report = job.status()
        if not report.status.is_terminal:
            if args.job_id:
                raise CliError(
                    f"kinetic job {job_id} is still {report.status.value}: cancel it first"
                )
            rows.append(
                {"job_id": job_id, "state": report.status.value, "action": "skipped (live)"}
            )
            continue
        if args.dry_run:
            rows.append({"job_id": job_id, "state": report.status.value, "action": "would delete"})
            continue
        deleted = job.cleanup()
        row = {"job_id": job_id, "state": report.status.value, "action": "deleted"}
        rows.append({**row, "objects": deleted})
    emit(rows, output_format(args), ("job_id", "state", "action", "objects"))
