"""Reading a finished job's result payload and turning it into a value or an exception.

The status alone never decides: a SUCCEEDED job without ``result.pkl`` is an error,
and a success payload from a FAILED multi-host job is not trusted (a worker failed).
With a job's result ``key`` (see ``core.jobs.signing``) nothing is unpickled unless its
signature matches: a substituted, truncated or crafted payload is an error naming
the job, and no code in it runs.

A remote error always arrives.  An exception pickles as its class and ``args``, so
one whose constructor does not take its ``args`` back (or whose class is not
importable here) makes the whole payload fail to load.  Then the verified bytes are
read again by :class:`_Lenient`, which puts a stand-in where an object cannot be
rebuilt; a failure payload read that way raises a ``RemoteFunctionError`` made from
the type name, message and traceback the runner recorded as plain strings.
"""

from __future__ import annotations

import io
import logging
import pickle
import pickletools
import time
from typing import Any

import cloudpickle

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.jobs.payload import (
    RemoteFunctionError,
    raise_remote_failure,
    remote_error,
)
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
        return cloudpickle.loads(blob)
    except Exception as exc:
        failure = _failure_despite(blob, f"{type(exc).__name__}: {exc}")
        if failure is not None:
            return failure
        raise RemoteFunctionError(
            f"{what} could not be deserialised here: {type(exc).__name__}: {exc}"
        ) from exc


class _Unbuilt:
    """Stands in for an object the lenient read could not rebuild, or for a class it
    could not find (a subclass per name, named as the pickle named it)."""

    def __init__(self, *args: Any, **_kwargs: Any) -> None:
        self.args = args
        self.built_as: str | None = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def describe(self) -> tuple[str, str]:
        """(type name, message as ``BaseException.__str__`` would have made it)."""
        cls = type(self)
        name = getattr(self, "built_as", None) or f"{cls.__module__}.{cls.__qualname__}"
        args = getattr(self, "args", ())
        return name, str(args[0]) if len(args) == 1 else str(args) if args else ""


class _Lenient(pickle._Unpickler):
    """Python's own pure-Python unpickler (the extension point dill uses too), reading
    on where the C one stops: a call that fails (an exception's class called with its
    ``args``) or a name not found where the pickle says yields an :class:`_Unbuilt`."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return type(name, (_Unbuilt,), {"__module__": module, "__qualname__": name})

    def _load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        try:
            self.stack[-1] = func(*args)
        except Exception:  # noqa: BLE001 - the point: read on past what cannot be rebuilt
            stand_in = _Unbuilt(*args)
            module = getattr(func, "__module__", None) or "?"
            stand_in.built_as = f"{module}.{getattr(func, '__qualname__', repr(func))}"
            self.stack[-1] = stand_in

    dispatch[pickle.REDUCE[0]] = _load_reduce


def _says_it_failed(blob: bytes) -> bool:
    """Whether the payload's first key, ``success`` (first in kinetic's runner and in
    ``make_result``), is False, read from the leading opcodes without loading
    anything: a value that cannot be loaded (gigabytes, perhaps) is not read twice."""
    try:
        ops = pickletools.genops(blob)
        for _, (op, arg, _pos) in zip(range(16), ops, strict=False):
            if op.name.endswith("UNICODE") and arg == "success":
                op, arg, _pos = next(ops)
                while op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                    op, arg, _pos = next(ops)
                return op.name == "NEWFALSE" or (op.name == "INT" and arg is False)
    except Exception:  # noqa: BLE001 - not a payload this reads leniently
        return False
    return False


def _failure_despite(blob: bytes, why: str) -> dict | None:
    """The failure payload in ``blob`` with its exception made from the recorded
    strings, when only the exception (or something in it) could not be rebuilt."""
    if not _says_it_failed(blob):
        return None
    try:
        payload = _Lenient(io.BytesIO(blob)).load()
    except Exception:  # noqa: BLE001 - unreadable anyway: the caller reports the first error
        return None
    if not isinstance(payload, dict) or payload.get("success") is not False:
        return None  # a value that cannot be rebuilt is not a failure to report
    exc = payload.get("exception")
    if not isinstance(exc, BaseException):
        found = exc.describe() if isinstance(exc, _Unbuilt) else (None, None)
        payload["exception"] = remote_error(payload, why, *found)
    return payload


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
    """``read_result`` plus the exact bytes that were verified and unpickled.

    The runner writes ``result.pkl`` and then its signature: a signed job's result
    found without its signature is read once more after the next wait (the writer
    may be between the two), then refused as unsigned."""
    key = artifact_key(job_id, "result.pkl")
    waited_for_signature = False
    for i, delay in enumerate(backoff):
        time.sleep(delay)
        try:
            blob = store.read_bytes(key)
        except ObjectNotFound:
            continue
        unsigned = result_key is not None and not store.exists(signature_key(key))
        if unsigned and not waited_for_signature and i + 1 < len(backoff):
            waited_for_signature = True
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
    failed: list[dict] | None = None,
) -> tuple[Any, bytes]:
    """``collect`` plus the verified ``result.pkl`` bytes (for a result reference).

    ``failed``: a list the failure payloads of every failing host are put in (the
    leader's first, then the workers', lowest host first) before one is raised."""
    backoff = RESULT_BACKOFF_S if status is JobStatus.SUCCEEDED else (0,)
    payload, blob = read_result_blob(store, job_id, backoff, result_key)
    where = store.uri(f"{job_id}/result.pkl")
    if payload is not None and payload.get("success") and status is not JobStatus.FAILED:
        metrics.incr("kinetic.job.result_bytes", len(blob))
        return payload.get("result"), blob
    failed_workers = worker_failures(store, job_id, result_key)
    if payload is not None and payload.get("success") and not failed_workers:
        # The function returned and its verified result is whole (written before its
        # signature, each atomically); the platform failed the pod afterwards (a node
        # reclaimed while the runner exited).  The value is the job's: running the
        # function again for it would run the job twice.
        log.warning(
            "kinetic job %s ended %s%s after its function returned; its verified result "
            "is the job's value",
            job_id,
            status.value,
            f" ({reason})" if reason else "",
        )
        metrics.incr("kinetic.job.result_bytes", len(blob))
        return payload.get("result"), blob
    if failed is not None:
        own = [payload] if payload is not None and not payload.get("success") else []
        failed.extend(own + [p for p in failed_workers if not p.get("success")])
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
