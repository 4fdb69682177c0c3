"""What each input of a batch ended as: results in order, the exception of each
failure (the remote error, a submit error, fail_fast's stop, or an input kinetic lost:
an error of ours, never silent), and their JSON form for XCom."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.batch.state import (
    CANCELLED,
    NOT_SUBMITTED,
    SUCCEEDED,
    BatchState,
)
from airflow_provider_kinetic.core.errors import KineticInternalError
from airflow_provider_kinetic.core.jobs.results import collect, collect_with_blob
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)


def gather(
    state: BatchState,
    store: ObjectStore,
    *,
    ordered: bool = True,
    result_key: Callable[[str], str | None] = lambda _job_id: None,
    deliver: Callable[[Any, str, bytes], Any] = lambda value, _job_id, _blob: value,
) -> tuple[list[Any], dict[int, BaseException]]:
    """Results (input order, or completion order) and the exception of each failure.

    ``result_key(job_id)``: the key each child's payloads are verified with;
    ``deliver(value, job_id, blob)``: what stands for a value in the results (e.g. a
    reference when it does not fit XCom).
    """
    indices = range(state.total) if ordered else state.order
    values: list[Any] = []
    failures: dict[int, BaseException] = {}
    for index in indices:
        outcome = state.done.get(index)
        if outcome == SUCCEEDED:
            job = state.jobs[index]
            value, blob = collect_with_blob(
                store, job, JobStatus.SUCCEEDED, result_key=result_key(job)
            )
            values.append(deliver(value, job, blob))
            continue
        exc = _failure(state, store, index, outcome, result_key)
        failures[index] = exc
        values.append(exc)
    return values, failures


def _failure(
    state: BatchState,
    store: ObjectStore,
    index: int,
    outcome: str | None,
    result_key: Callable[[str], str | None],
) -> BaseException:
    if index in state.submit_errors:
        return RuntimeError(f"submission failed: {state.submit_errors[index]}")
    if outcome in (CANCELLED, NOT_SUBMITTED) and state.fail_fast and state.stopped:
        # fail_fast stopped the batch (``stop``): the only way an input ends unrun.
        return RuntimeError(f"{outcome.lower().replace('_', ' ')} (fail_fast)")
    if outcome in (CANCELLED, NOT_SUBMITTED, None):
        return _not_run(state, index, outcome)
    try:
        job = state.jobs[index]
        why = state.failed_why.get(index)
        collect(store, job, JobStatus.FAILED, why, result_key=result_key(job))
    except Exception as exc:  # noqa: BLE001 - the remote error is the value we want
        return exc
    return RuntimeError("failed without an error payload")


def _not_run(state: BatchState, index: int, outcome: str | None) -> KineticInternalError:
    """An input that never ran although fail_fast did not stop the batch: kinetic lost
    it, an error of ours; logged as one and named in the batch's failure."""
    why = "fail_fast is off" if not state.fail_fast else "fail_fast did not stop the batch"
    message = (
        f"inputs[{index}] never ran ({(outcome or 'no outcome').lower().replace('_', ' ')}; "
        f"{why}): a bug in airflow-provider-kinetic, not an error of your function or "
        f"inputs (batch {state.group_id}; please report it)"
    )
    log.error("%s", message)
    return KineticInternalError(message)


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """JSON form of a failed position (XCom cannot hold exception objects)."""
    tb = next((n for n in getattr(exc, "__notes__", []) if n.startswith("Remote traceback")), None)
    # An exception that could not be rebuilt here arrives as a RemoteFunctionError that
    # keeps the remote type name and message (``core.jobs.payload.remote_error``).
    remote_type = getattr(exc, "remote_type", None)
    return {
        "__kinetic_error__": True,
        "type": remote_type.rsplit(".", 1)[-1] if remote_type else type(exc).__name__,
        "qualified_type": remote_type or f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": getattr(exc, "remote_message", None) or str(exc),
        "traceback": tb or getattr(exc, "remote_traceback", None),
    }
