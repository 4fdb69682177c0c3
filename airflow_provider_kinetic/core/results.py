"""Reading a finished job's result payload and turning it into a value or an exception.

The status alone never decides: a SUCCEEDED job without ``result.pkl`` is an error,
and a success payload from a FAILED multi-host job is not trusted (a worker failed).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import cloudpickle

from airflow_provider_kinetic.core.handles import JobStatus, artifact_key
from airflow_provider_kinetic.core.payload import RemoteFunctionError, raise_remote_failure
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

#: Waits between reads of a result that is not there yet (eventual upload after exit).
RESULT_BACKOFF_S = (0, 0.5, 1, 2, 4)


def read_result(store: ObjectStore, job_id: str, backoff: tuple = RESULT_BACKOFF_S) -> dict | None:
    """The unpickled ``result.pkl`` dict, or None when it never appears."""
    key = artifact_key(job_id, "result.pkl")
    for delay in backoff:
        time.sleep(delay)
        try:
            blob = store.read_bytes(key)
        except ObjectNotFound:
            continue
        try:
            payload = cloudpickle.loads(blob)
        except Exception as exc:
            raise RemoteFunctionError(
                f"result payload {store.uri(key)} could not be deserialised here: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(payload, dict):
            raise RemoteFunctionError(f"result payload {store.uri(key)} is not a dict")
        return payload
    return None


def worker_failures(store: ObjectStore, job_id: str) -> list[dict]:
    """Failure payloads written by non-leader hosts, lowest host first."""
    keys = [k for k in store.list(f"{job_id}/result-worker-") if k.endswith(".pkl")]
    out = []
    for key in keys:
        try:
            out.append(cloudpickle.loads(store.read_bytes(key)))
        except Exception:  # noqa: BLE001 - a broken worker payload must not hide the rest
            log.warning("could not read %s", store.uri(key))
    return sorted(out, key=lambda p: p.get("host_index", 0))


def collect(store: ObjectStore, job_id: str, status: JobStatus, reason: str | None = None) -> Any:
    """Return the function's value, or raise the remote exception (with its traceback)."""
    backoff = RESULT_BACKOFF_S if status is JobStatus.SUCCEEDED else (0,)
    payload = read_result(store, job_id, backoff)
    where = store.uri(f"{job_id}/result.pkl")
    if payload is not None and payload.get("success") and status is not JobStatus.FAILED:
        return payload.get("result")
    failed_workers = worker_failures(store, job_id)
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
