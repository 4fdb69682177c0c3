"""Running a planned batch: launch under the cap, fold statuses, retry, recover, stop
(what each input ended as: ``core.batch.outcomes``; the manifest: ``core.batch.manifest``).

Everything works on the :class:`BatchState` from ``core.batch.plan_batch`` (JSON on
the wire) so the operator can carry it across deferrals.  One status query per poll covers every
active child (``Backend.batch_status``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch.manifest import write_manifest
from airflow_provider_kinetic.core.batch.plan import PAYLOAD_CACHE
from airflow_provider_kinetic.core.batch.state import (
    CANCELLED,
    FAILED,
    NOT_SUBMITTED,
    REASON_MAX,
    SUCCEEDED,
    BatchState,
)
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.fallback import describe_step, next_step
from airflow_provider_kinetic.core.jobs.history import DATA_HASHES
from airflow_provider_kinetic.core.jobs.outputs import start_empty
from airflow_provider_kinetic.core.jobs.results import is_preemption
from airflow_provider_kinetic.core.jobs.submit import adopted, create_job, make_private
from airflow_provider_kinetic.core.jobs.taskrecord import succeeded_result
from airflow_provider_kinetic.core.runtime.context import CONTEXT_CACHE
from airflow_provider_kinetic.core.spec.handles import (
    JobHandle,
    JobStatus,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

MAX_PREEMPTION_RETRIES = 3


def start_batch(
    state: BatchState, objects: dict[str, bytes], local: list[Data], store: ObjectStore
) -> None:
    """Upload data and shared objects (content-addressed: present = skipped), manifest."""
    datacache.upload_all(store, local)
    start_empty(store, state.template.output_dir, f"batch {state.group_id}")  # a new batch
    for key, blob in objects.items():
        if key.startswith((PAYLOAD_CACHE, CONTEXT_CACHE)) and store.exists(key):
            log.info("shared object %s already in the store", store.uri(key))
            continue
        store.write_bytes(key, blob)
        make_private(store, key)
    write_manifest(state, store)
    history.submitted(
        store,
        state.group_id,
        state.template.identity,
        backend=state.template.backend,
        accelerator=state.template.options.accelerator,
        func=state.template.func_name,
        output_dir=state.template.output_dir,
        submitted_at=state.created_at,
        kind="batch",
        total=state.total,
        capacity=state.template.options.capacity[0] if state.template.options.capacity else None,
        # What its children read: ``data gc`` keeps it while the entry is there.
        **({DATA_HASHES: list(held)} if (held := state.extra.get(DATA_HASHES)) else {}),
    )


def child_job_id(group_id: str, index: int, launch: int) -> str:
    """The job id of a child's ``launch``-th job: derived, so a resumed batch (a retried
    or re-run map task) finds every child it created without a per-child record."""
    digest = hashlib.sha256(f"{group_id}/{index}/{launch}".encode()).hexdigest()
    return "job-" + digest[:8]


def child_spec(
    state: BatchState,
    index: int,
    job_id: str,
    config: KineticConfig,
    store: ObjectStore,
    signing_secret: bytes | None = None,
) -> JobSpec:
    """The JobSpec of one child: the batch's template plus its input index (for the
    capacity step the input is on)."""
    step = state.steps.get(index, 0)
    return state.template.spec(config, store, job_id, index, signing_secret, step=step)


def launch(
    state: BatchState,
    config: KineticConfig,
    backend: Backend,
    store: ObjectStore,
    signing_secret: bytes | None = None,
    *,
    probe: bool = False,
    halted: Callable[[], bool] | None = None,
) -> int:
    """Submit queued inputs while fewer than ``max_concurrent`` are active.

    ``probe``: the state may be older than the batch (a trigger re-created after a
    triggerer restart starts from its last saved state): a child whose derived job
    id already has a ``handle.json`` is adopted, not created again
    (``jobs.submit.adopted``), so no input ever runs twice.  ``halted``: asked before
    each launch; once true, the rest stay queued (a trigger being stopped).

    An input leaves the queue only as it becomes active (or failed to submit), with
    no I/O between: an error on the way leaves it queued, never neither."""
    launched = 0
    if not state.queue and not state.active and not state.stopped:
        # The batch would end here: not while an input has no outcome of its own.
        lost = recover(state, config, backend, store, signing_secret)
        launched += sum(index in state.active for index in lost)  # adopted (the rest queued)
    while state.queue and len(state.active) < state.max_concurrent and not state.stopped:
        if halted is not None and halted():
            break
        index = state.queue[0]
        launch_no = state.launches.get(index, 0) + 1
        job_id = child_job_id(state.group_id, index, launch_no)
        spec = child_spec(state, index, job_id, config, store, signing_secret)
        handle = state.template.handle(config, store, spec, index, step=state.steps.get(index, 0))
        try:
            if not (probe and adopted(store, backend, spec, handle)):
                if launch_no > 1:  # the input's earlier job left its files there
                    start_empty(store, state.template.output_uri(index), f"inputs[{index}]")
                create_job(store, backend, spec, handle)
        except Exception as exc:  # noqa: BLE001 - recorded per index, never retried
            state.queue.pop(0)
            state.launches[index] = launch_no
            state.submit_errors[index] = f"{type(exc).__name__}: {exc}"
            state.done[index] = FAILED
            state.order.append(index)
            log.error("could not submit inputs[%d]: %s", index, exc)
            if state.fail_fast:
                state.stopped = True
            continue
        state.queue.pop(0)
        state.launches[index] = launch_no
        state.active[index] = handle
        state.jobs[index] = handle.job_id
        state.attempts[index] = state.attempts.get(index, 0) + 1
        state.manifest_dirty = True
        launched += 1
    return launched


def unaccounted(state: BatchState) -> list[int]:
    """Inputs neither queued, active nor done: none, unless kinetic lost track of one
    (a bug of ours, never the user's: every input ends with an outcome of its own)."""
    seen = set(state.queue)
    seen.update(state.active)
    seen.update(state.done)
    return [index for index in range(state.total) if index not in seen]


def launches_key(group_id: str) -> str:
    return f"_groups/{group_id}/launches.json"


def save_launches(store: ObjectStore, state: BatchState) -> None:
    """Record how many jobs each input had when the batch ended, before the cleanup
    policy may delete their ``handle.json``: a resumed try then finds its succeeded
    children past a failed launch whose artifacts went (``resume.resume_batch``).
    Not sealed: a wrong count only makes resume probe a job id that does not exist
    (run again) and every success is still read from its sealed record."""
    body = {"group_id": state.group_id, "launches": {str(i): n for i, n in state.launches.items()}}
    store.write_bytes(launches_key(state.group_id), json.dumps(body, sort_keys=True).encode())


def read_launches(store: ObjectStore, group_id: str) -> dict[int, int]:
    """What :func:`save_launches` recorded (empty: nothing, or unreadable)."""
    try:
        body = json.loads(store.read_bytes(launches_key(group_id)))
        return {int(i): int(n) for i, n in (body.get("launches") or {}).items()}
    except (ObjectNotFound, ValueError, TypeError, AttributeError):
        return {}


def latest_launch(store: ObjectStore, group_id: str, index: int, recorded: int = 0) -> int:
    """How many of input ``index``'s derived jobs were created (each has its
    ``handle.json`` from before its create): the batch's own launch records, from
    ``recorded`` on (the count :func:`save_launches` kept, so a launch whose
    artifacts the cleanup policy deleted is no gap that hides the later ones)."""
    launch = max(0, recorded)
    while store.exists(artifact_key(child_job_id(group_id, index, launch + 1), "handle.json")):
        launch += 1
    return launch


def recover(
    state: BatchState,
    config: KineticConfig,
    backend: Backend,
    store: ObjectStore,
    signing_secret: bytes | None = None,
) -> list[int]:
    """Put back every input the state lost track of (:func:`unaccounted`), each once.

    Its derived job ids tell a child that was created from one never created: a job
    newer than the last one the state recorded for the input (``jobs``) was launched
    and not recorded, so it is adopted (made under the same id if its create never
    happened, ``jobs.submit.adopted``); else the input is queued first and launched
    once, under the next id.  Either way it is said as the error of ours it is.  A
    batch fail_fast stopped launches nothing more: its report names such an input."""
    if state.stopped:
        return []
    lost = unaccounted(state)
    for index in lost:
        created = latest_launch(store, state.group_id, index)
        known = state.jobs.get(index)
        recorded = next(
            (n for n in range(created, 0, -1) if child_job_id(state.group_id, index, n) == known),
            0,
        )
        state.launches[index] = created
        if created > recorded:
            job_id = child_job_id(state.group_id, index, created)
            spec = child_spec(state, index, job_id, config, store, signing_secret)
            step = state.steps.get(index, 0)
            handle = state.template.handle(config, store, spec, index, step=step)
            adopted(store, backend, spec, handle)
            state.active[index] = handle
            state.jobs[index] = job_id
            state.attempts[index] = state.attempts.get(index, 0) + 1
            state.manifest_dirty = True
            what = f"its child {job_id} (created, not recorded) is adopted"
        else:
            state.queue.insert(0, index)
            what = "it is launched now"
        log.error(
            "kinetic bug (not an error of your function or inputs): batch %s had lost "
            "track of inputs[%d] (neither queued, running nor done); %s",
            state.group_id,
            index,
            what,
        )
    return lost


def observe(
    state: BatchState,
    statuses: dict[str, StatusReport],
    backend: Backend,
    store: ObjectStore,
    result_key: Callable[[JobHandle], str | None] | None = None,
) -> list[int]:
    """Fold terminal child statuses into ``state``; returns indices that finished.

    ``result_key`` (drivers that may restart): a child whose job is gone (NOT_FOUND)
    but left an authentic success payload succeeded; its job was deleted by a driver
    that did not live to save that.

    fail_fast stops the batch (:func:`stop`) after every report of the poll is
    folded in: two children that failed in one poll both end FAILED (the second
    not retried), never the second cancelled by the first's stop mid-loop."""
    finished: list[int] = []
    failed_now: list[int] = []
    try:
        _fold(state, statuses, store, backend, result_key, finished, failed_now)
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
