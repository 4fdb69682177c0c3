"""Reading a finished job's result payload and turning it into a value or an exception.

The status alone never decides: a SUCCEEDED job without ``result.pkl`` is an error,
and a success payload from a FAILED multi-host job is not trusted (a worker failed).
With a job's result ``key`` (see ``core.jobs.signing``) nothing is unpickled unless its
signature matches: a substituted, truncated or crafted payload is an error naming
the job, and no code in it runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_provider_kinetic.core.jobs import unpickling
from airflow_provider_kinetic.core.jobs.payload import RemoteFunctionError, raise_remote_failure
from airflow_provider_kinetic.core.jobs.signing import signature_key, verify
from airflow_provider_kinetic.core.spec.handles import (
    PREEMPTION_REASONS,
    JobHandle,
    JobStatus,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

#: Waits between reads of a result that is not there yet (eventual upload after exit).
RESULT_BACKOFF_S = (0, 0.5, 1, 2, 4)


def is_preemption(report: StatusReport, store: ObjectStore, handle: JobHandle) -> bool:
    """A platform kill: a preemption-like reason and no result from the function."""
    return (
        report.status is JobStatus.FAILED
        and report.reason in PREEMPTION_REASONS
        and not store.exists(artifact_key(handle.job_id, "result.pkl"))
    )


def read_signature(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.read_bytes(signature_key(key))
    except ObjectNotFound:
        return None


def verified_loads(
    store: ObjectStore, key: str, blob: bytes, job_id: str, result_key: str | None
) -> Any:
    """Unpickle ``blob`` (read from ``key``) once its signature checks out (with a key)."""
    what = f"result payload {store.uri(key)} of job {job_id}"
    if result_key is not None:
        verify(result_key, blob, read_signature(store, key), what)
    try:
        return unpickling.loads(blob)
    except Exception as exc:
        raise RemoteFunctionError(
            f"{what} could not be deserialised here: {type(exc).__name__}: {exc}"
        ) from exc


def read_result(
    store: ObjectStore,
    job_id: str,
    backoff: tuple = RESULT_BACKOFF_S,
    result_key: str | None = None,
) -> dict | None:
    """The unpickled ``result.pkl`` dict, or None when it never appears."""
    return read_result_blob(store, job_id, backoff, result_key)[0]


def read_result_blob(
    store: ObjectStore, job_id: str, backoff: tuple, result_key: str | None
) -> tuple[dict | None, bytes]:
    """``read_result`` plus the exact bytes that were verified and unpickled."""
    key = artifact_key(job_id, "result.pkl")
    for delay in backoff:
        time.sleep(delay)
        try:
            blob = store.read_bytes(key)
        except ObjectNotFound:
            continue
        payload = verified_loads(store, key, blob, job_id, result_key)
        if not isinstance(payload, dict):
            raise RemoteFunctionError(f"result payload {store.uri(key)} is not a dict")
        return payload, blob
    return None, b""


def worker_failures(store: ObjectStore, job_id: str, result_key: str | None = None) -> list[dict]:
    """Failure payloads written by non-leader hosts, lowest host first (verified)."""
    keys = [k for k in store.list(f"{job_id}/result-worker-") if k.endswith(".pkl")]
    out = []
    for key in keys:
        try:
            out.append(verified_loads(store, key, store.read_bytes(key), job_id, result_key))
        except Exception as exc:  # noqa: BLE001 - a broken worker payload must not hide the rest
            log.warning("could not read %s: %s", store.uri(key), exc)
    return sorted(out, key=lambda p: p.get("host_index", 0))


def collect(
    store: ObjectStore,
    job_id: str,
    status: JobStatus,
    reason: str | None = None,
    *,
    result_key: str | None = None,
) -> Any:
    """Return the function's value, or raise the remote exception (with its traceback).

    ``result_key``: the job's key; every payload is verified before it is unpickled.
    """
    return collect_with_blob(store, job_id, status, reason, result_key=result_key)[0]


def collect_with_blob(
    store: ObjectStore,
    job_id: str,
    status: JobStatus,
    reason: str | None = None,
    *,
    result_key: str | None = None,
) -> tuple[Any, bytes]:
    """``collect`` plus the verified ``result.pkl`` bytes (for a result reference)."""
    backoff = RESULT_BACKOFF_S if status is JobStatus.SUCCEEDED else (0,)
    payload, blob = read_result_blob(store, job_id, backoff, result_key)
    where = store.uri(f"{job_id}/result.pkl")
    if payload is not None and payload.get("success") and status is not JobStatus.FAILED:
        return payload.get("result"), blob
    failed_workers = worker_failures(store, job_id, result_key)
    if payload is not None and not payload.get("success"):
        raise_remote_failure(payload, where)
    if failed_workers:
        raise_remote_failure(failed_workers[0], where)
    why = f" ({reason})" if reason else ""
    if status is JobStatus.SUCCEEDED:
        raise RemoteFunctionError(f"job {job_id} completed but no result payload exists at {where}")
    if status is JobStatus.NOT_FOUND:
        raise RemoteFunctionError(
            f"job {job_id} was not found and no result payload exists at {where}{why}"
        )
    raise RemoteFunctionError(f"job {job_id} failed{why}; no result payload at {where}")
