"""A failed job's class and phase (``core.spec.failure.Failure``), from what it left.

The runner's failure payload decides when there is one: its ``phase`` (the runner
records the phase it failed in), and the function's own phases (``execute``,
``result serialization``) are the user's error, except a ``MemoryError`` (a memory
limit, an rlimit: the environment's); a failure while preparing the job
(requirements install, data resolve, ...) is infra; storing the result, the store's.
Without a payload the platform's reason decides (``StatusReport.reason`` of either
backend): a spot reclaim or a node shut down under the job is a preemption; no
capacity within the wait (or unschedulable past the schedule timeout) is
no_capacity; a run deadline is a timeout; an image pull, OOM, a crash outside the
function, an eviction or a lost node are infra.  A job that succeeded but whose
result cannot be read, or whose payload fails its signature, failed in the store
(never re-submitted: its function ran).  Exit codes the task counts as infra
(``retry_on={"exit_codes": [...]}``) make any failure with that code infra.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from airflow_provider_kinetic.core.backends.k8s import status as k8s
from airflow_provider_kinetic.core.jobs.signing import ResultAuthError
from airflow_provider_kinetic.core.spec.failure import USER_PHASES, Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import (
    REASON_EVICTED,
    REASON_NO_CAPACITY,
    REASON_PREEMPTED,
    JobStatus,
    StatusReport,
)

#: Reasons of jobs whose container never started: they failed at startup.
_STARTUP = frozenset(
    {
        *k8s.IMAGE_PULL_REASONS.values(),
        k8s.REASON_CONTAINER_CONFIG,
        k8s.REASON_FAILED_MOUNT,
        k8s.REASON_FAILED_CREATE,
    }
)
#: The local backend's reasons (``core.backends.local.reasons``) and Kubernetes'
#: messages name an exit code or a signal these ways.
_EXIT = re.compile(r"(?:exit code|exited with code) (-?\d+)")
_SIGNAL = re.compile(r"killed by (SIG[A-Z0-9]+)")
_LOCAL_STARTUP = ("never started", "before the runner started")
#: What a Job's failed condition says when its run deadline passed.
_DEADLINE = "DeadlineExceeded"
#: The remote exception types that mean the environment ran out of memory.
_OUT_OF_MEMORY = frozenset({"builtins.MemoryError"})
#: The local backend's reason for a job it cancelled.
LOCAL_CANCELLED = "cancelled"


def exit_code_of(text: str | None) -> int | None:
    """The exit code a reason or message names (a signal ``S``: 128 + S)."""
    if not text:
        return None
    found = _SIGNAL.search(text)
    if found:
        try:
            return 128 + int(signal.Signals[found.group(1)])
        except KeyError:
            return None
    found = _EXIT.search(text)
    if found:
        code = int(found.group(1))
        return 128 - code if code < 0 else code
    return None


def classify(
    job_id: str | None,
    report: StatusReport,
    payload: Mapping[str, Any] | None = None,
    *,
    failed_hosts: Sequence[int] = (),
    host_count: int | None = None,
    cancelled: bool = False,
    error: BaseException | None = None,
    infra_exit_codes: Collection[int] = (),
) -> Failure:
    """The failure of job ``job_id``, which ended with ``report``.

    ``payload``: the failure payload of its lowest failing host (the leader's
    ``result.pkl`` or a worker's), None when no host wrote one; ``failed_hosts``:
    every host that wrote one; ``cancelled``: someone asked for its cancel;
    ``error``: what reading its result raised when there is no payload (the store's
    failure for a job that succeeded)."""
    exit_code = exit_code_of(report.reason) or exit_code_of(report.message)
    if payload is not None and payload.get("success") is False:
        failure = _from_payload(job_id, report, payload, exit_code)
    else:
        failure = _from_report(job_id, report, exit_code, cancelled, error)
    hosts = sorted(set(failed_hosts))
    others = tuple(h for h in hosts if h != failure.host_index)
    changes: dict[str, Any] = {"host_count": host_count, "other_hosts": others}
    layout = payload or {}
    if isinstance(layout.get("slice_hosts"), int) and isinstance(layout.get("num_slices"), int):
        # A multi-slice job (the runner says so): every slice's hosts count.
        changes["slice_hosts"] = layout["slice_hosts"]
        changes["host_count"] = layout["slice_hosts"] * layout["num_slices"]
    code = failure.exit_code
    if code is not None and code in infra_exit_codes and failure.failure_class in _RECLASSIFIABLE:
        changes["failure_class"] = FailureClass.INFRA
    return _evolve(failure, changes)


_RECLASSIFIABLE = frozenset({FailureClass.USER_ERROR, FailureClass.INFRA})


def _from_payload(
    job_id: str | None, report: StatusReport, payload: Mapping[str, Any], exit_code: int | None
) -> Failure:
    phase = str(payload.get("phase") or "execute")
    exc_type = payload.get("exception_type")
    exc = payload.get("exception")
    if not exc_type and isinstance(exc, BaseException):
        exc_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
    message = payload.get("exception_message")
    if message is None and isinstance(exc, BaseException):
        message = str(exc)
    if phase == "store result":
        kind = FailureClass.STORE
    elif phase in USER_PHASES and exc_type not in _OUT_OF_MEMORY:
        kind = FailureClass.USER_ERROR
    else:
        kind = FailureClass.INFRA
    own = payload.get("exit_code")
    return Failure(
        kind,
        phase=phase,
        job_id=job_id,
        exit_code=own if isinstance(own, int) else exit_code,
        host_index=int(payload.get("host_index") or 0),
        exception_type=exc_type,
        exception_message=message,
        traceback=payload.get("traceback"),
        reason=report.reason,
        message=report.message,
    )


def _from_report(
    job_id: str | None,
    report: StatusReport,
    exit_code: int | None,
    cancelled: bool,
    error: BaseException | None,
) -> Failure:
    reason, message = report.reason or "", report.message
    phase: str | None = None
    if cancelled or reason == LOCAL_CANCELLED:
        kind = FailureClass.CANCELLED
    elif report.status is JobStatus.SUCCEEDED or isinstance(error, ResultAuthError):
        # It ran and its result could not be read (or not trusted): never re-run it.
        kind = FailureClass.STORE
        message = f"{type(error).__name__}: {error}" if error is not None else message
    elif reason == REASON_PREEMPTED:
        kind = FailureClass.PREEMPTION
    elif reason in (REASON_NO_CAPACITY, k8s.REASON_UNSCHEDULABLE):
        kind, phase = FailureClass.NO_CAPACITY, "startup"
    elif _DEADLINE in reason or _DEADLINE in message:
        kind = FailureClass.TIMEOUT
    elif reason in _STARTUP or any(s in reason for s in _LOCAL_STARTUP):
        kind, phase = FailureClass.INFRA, "startup"
    else:  # OOM, eviction, a lost node, a crash outside the function, a signal
        kind = FailureClass.INFRA
    if reason == REASON_EVICTED and not message:
        message = "the pod was evicted"
    return Failure(
        kind,
        phase=phase,
        job_id=job_id,
        exit_code=exit_code,
        reason=report.reason,
        message=message or report.describe(),
    )


def _evolve(failure: Failure, changes: dict[str, Any]) -> Failure:
    return replace(failure, **{k: v for k, v in changes.items() if v is not None})
