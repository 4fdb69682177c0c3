"""Observing a launched batch: fold its children's statuses into the state (a capacity
step given up, a preemption re-submitted, a failure retried or final), stop it on
fail_fast, count its outcomes (what each input ended as: ``core.batch.outcomes``).

Children are launched (and a lost input recovered) by ``core.batch.launch``; both work
on the :class:`BatchState` from ``core.batch.plan_batch`` (JSON on the wire) so the
operator can carry it across deferrals.  One status query per poll covers every active
child (``Backend.batch_status``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch.state import (
    CANCELLED,
    FAILED,
    NOT_SUBMITTED,
    REASON_MAX,
    SUCCEEDED,
    BatchState,
)
from airflow_provider_kinetic.core.jobs.fallback import describe_step, next_step
from airflow_provider_kinetic.core.jobs.finish import failure_of
from airflow_provider_kinetic.core.jobs.results import is_preemption
from airflow_provider_kinetic.core.jobs.retry_on import RetryOn
from airflow_provider_kinetic.core.jobs.taskrecord import succeeded_result
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)

MAX_PREEMPTION_RETRIES = 3


def observe(
    state: BatchState,
    statuses: dict[str, StatusReport],
    backend: Backend,
    store: ObjectStore,
    result_key: Callable[[JobHandle], str | None] | None = None,
    *,
    payload_key: Callable[[JobHandle], str | None] | None = None,
) -> list[int]:
    """Fold terminal child statuses into ``state``; returns indices that finished.

    ``result_key`` (drivers that may restart): a child whose job is gone (NOT_FOUND)
    but left an authentic success payload succeeded; its job was deleted by a driver
    that did not live to save that.  ``payload_key`` (else ``result_key``): the key a
    failed child's payload is verified with before ``input_retries`` in its per-class
    form reads its class and phase.

    fail_fast stops the batch (:func:`stop`) after every report of the poll is
    folded in: two children that failed in one poll both end FAILED (the second
    not retried), never the second cancelled by the first's stop mid-loop."""
    finished: list[int] = []
    failed_now: list[int] = []
    try:
        keys = payload_key or result_key
        _fold(state, statuses, store, backend, result_key, finished, failed_now, keys)
    finally:
        # Also after an error midway (the poll is asked again): an input already
        # FAILED here must still stop the batch, or its queue would never end.
        if state.fail_fast and not state.stopped:
            failed = failed_now or [i for i, outcome in state.done.items() if outcome == FAILED]
            if failed:
                stop(state, backend, ", ".join(f"inputs[{i}]" for i in failed) + " failed")
    return finished


def _fold(
    state: BatchState,
    statuses: dict[str, StatusReport],
    store: ObjectStore,
    backend: Backend,
    result_key: Callable[[JobHandle], str | None] | None,
    finished: list[int],
    failed_now: list[int],
    payload_key: Callable[[JobHandle], str | None] | None = None,
) -> None:
    """:func:`observe`'s loop: ``finished`` and ``failed_now`` (inputs that failed
    for good in this poll) grow as each input leaves ``active``."""
    for index, handle in list(state.active.items()):
        report = statuses.get(handle.job_id)
        if report is None or not report.status.is_terminal:
            continue
        if (
            report.status is JobStatus.NOT_FOUND
            and result_key is not None
            and succeeded_result(store, handle, result_key)
        ):
            report = StatusReport(JobStatus.SUCCEEDED)
        # Its outcome is in the store (or it failed): delete the Job / LeaderWorkerSet
        # now, so no finished child holds a node (a stuck pod's Job goes before a retry).
        backend.cancel(handle)
        step = next_step(state.template.options.capacity, handle, report, store)
        preempted = (
            report.status is not JobStatus.SUCCEEDED
            and step is None
            and is_preemption(report, store, handle)
        )
        failure = None
        if state.retry_on is not None and report.status is not JobStatus.SUCCEEDED and step is None:
            policy = RetryOn.from_dict(state.retry_on)
            key = payload_key(handle) if payload_key is not None else None
            failure = failure_of(store, handle, report, key, policy.exit_codes)
            if failure is None:  # it left a good result after all (its pod was gone)
                report = StatusReport(JobStatus.SUCCEEDED)
        # Every call that can fail is made: the input leaves ``active`` for ``done`` or
        # the queue with nothing between (an error above leaves it active, asked again).
        del state.active[index]
        state.capacity_used[index] = handle.capacity or "on-demand"
        if report.status is JobStatus.SUCCEEDED:
            state.done[index] = SUCCEEDED
        elif step is not None:  # nothing of it ran: the next capacity step, not a retry
            metrics.incr("kinetic.job.capacity_steps", 1, {"capacity": state.capacity_used[index]})
            state.steps[index] = step
            state.attempts[index] -= 1
            log.warning(
                "inputs[%d] (%s): giving up %s: %s; trying %s",
                index,
                handle.job_id,
                describe_step(state.template.options.capacity, step - 1),
                report.message,
                describe_step(state.template.options.capacity, step),
            )
            state.queue.insert(0, index)
            continue
        elif failure is not None:  # input_retries per class
            if _resubmit_by_class(state, index, handle, failure, failed_now):
                continue
            failed_now.append(index)
        elif preempted and state.preemptions.get(index, 0) < MAX_PREEMPTION_RETRIES:
            state.preemptions[index] = state.preemptions.get(index, 0) + 1
            metrics.incr("kinetic.job.preemptions", 1, {"capacity": state.capacity_used[index]})
            state.attempts[index] -= 1  # does not count against ``retries``
            log.warning("inputs[%d] (%s) was preempted: resubmitting", index, handle.job_id)
            state.queue.insert(0, index)
            continue
        elif (
            state.attempts.get(index, 1) <= state.retries
            and not state.stopped
            and not (state.fail_fast and failed_now)
        ):
            log.warning(
                "inputs[%d] (%s) failed (%s): retrying",
                index,
                handle.job_id,
                report.reason or report.status.value,
            )
            state.queue.insert(0, index)
            continue
        else:
            state.done[index] = FAILED
            why = state.failed_why[index] = (report.reason or report.status.value)[:REASON_MAX]
            log.warning("inputs[%d] (%s) failed (%s)", index, handle.job_id, why)
            failed_now.append(index)
        state.order.append(index)
        finished.append(index)


def _resubmit_by_class(
    state: BatchState,
    index: int,
    handle: JobHandle,
    failure: Failure,
    failed_now: list[int],
) -> bool:
    """``input_retries`` in its per-class form (``core.jobs.retry_on``): queue input
    ``index`` again (True) while its failure's class has re-submits left; else it is
    FAILED, its reason the failure's line (False)."""
    policy = RetryOn.from_dict(state.retry_on or {})
    kind = failure.failure_class.value
    used = state.resubmits.get(index, {})
    budget = policy.budget(kind)
    if used.get(kind, 0) < budget and not state.stopped and not (state.fail_fast and failed_now):
        used = state.resubmits[index] = {**used, kind: used.get(kind, 0) + 1}
        state.attempts[index] -= 1  # counted per class, not against ``retries``
        if kind == FailureClass.PREEMPTION.value:
            state.preemptions[index] = state.preemptions.get(index, 0) + 1
            metrics.incr("kinetic.job.preemptions", 1, {"capacity": state.capacity_used[index]})
        log.warning(
            "inputs[%d] (%s) %s: resubmitting (%s re-submit %d/%d)",
            index,
            handle.job_id,
            failure.describe(),
            kind,
            used[kind],
            budget,
        )
        state.queue.insert(0, index)
        return True
    state.done[index] = FAILED
    why = state.failed_why[index] = failure.describe()[:REASON_MAX]
    log.warning("inputs[%d] (%s) %s", index, handle.job_id, why)
    return False


def stop(state: BatchState, backend: Backend, why: str) -> None:
    """fail_fast: launch nothing more and cancel running siblings.

    The queue goes first (nothing more launches), then each sibling leaves ``active``
    as it is cancelled, and the batch reads ``stopped`` only once all are: a cancel
    that fails midway leaves a state the next poll's :func:`observe` stops again."""
    log.warning(
        "fail_fast: %s; cancelling %d running children, skipping %d queued",
        why,
        len(state.active),
        len(state.queue),
    )
    for index in state.queue:
        state.done[index] = NOT_SUBMITTED
    state.queue.clear()
    for index, handle in list(state.active.items()):
        backend.cancel(handle)
        del state.active[index]
        state.done[index] = CANCELLED
        state.order.append(index)
    state.stopped = True


def is_finished(state: BatchState) -> bool:
    return state.finished


def counts(state: BatchState) -> dict[str, int]:
    """Per-status counts for the task log and the ``kinetic_batch`` XCom."""
    done = Counter(state.done.values())
    return {
        "total": state.total,
        "queued": len(state.queue),
        "active": len(state.active),
        "succeeded": done[SUCCEEDED],
        "failed": done[FAILED],
        "cancelled": done[CANCELLED],
        "not_submitted": done[NOT_SUBMITTED],
        "submitted": len(state.jobs),
        # Ended children per capacity kind of the job that ended them ("spot": 3, ...).
        "capacity": dict(Counter(s.partition(":")[0] for s in state.capacity_used.values())),
    }
