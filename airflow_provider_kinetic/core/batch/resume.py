"""Batches resume: a retried or re-run map task reattaches to its group.

The plan (the initial ``BatchState``: template, options, inputs) is written once per
batch, sealed with the deployment secret, at ``_groups/{group_id}/state.json``.
Children have derived job ids (``batchrun.child_job_id``), so a new try finds every
child the earlier tries created by probing ``{job_id}/handle.json`` — no per-child
record, so a batch still writes N + c objects.  Then the try-rule applies per child:
succeeded children are collected, running ones adopted (unless the earlier try was
deferred and killed from outside: then they are cancelled and run again), and only
failed, cancelled or missing ones are submitted again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.signing import seal, unseal
from airflow_provider_kinetic.core.jobs.taskrecord import (
    cancel_requested,
    request_cancel,
    succeeded_result,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, artifact_key
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)


def _write_sealed(store: ObjectStore, key: str, state: BatchState, secret: bytes) -> None:
    """``state`` at ``key``, sealed with the deployment secret (plan, live, driven)."""
    store.write_bytes(key, seal(secret, state.to_dict()), content_type="application/json")


def plan_key(group_id: str) -> str:
    return f"_groups/{group_id}/state.json"


def save_plan(store: ObjectStore, state: BatchState, secret: bytes) -> None:
    """Write the batch's initial state once (sealed): what a resumed try starts from."""
    _write_sealed(store, plan_key(state.group_id), state, secret)


def live_key(group_id: str) -> str:
    return f"_groups/{group_id}/live.json"


def save_live(store: ObjectStore, state: BatchState, secret: bytes) -> None:
    """The batch's current state (sealed), for a driver in another process: a batch
    submitted with ``wait_for_completion=False`` is driven by ``KineticBatchSensor``,
    whose pokes (reschedule mode) or retries start from this.  Written when the
    state changes, not per poll."""
    _write_sealed(store, live_key(state.group_id), state, secret)


def load_live(store: ObjectStore, group_id: str, secret: bytes) -> BatchState:
    """The state :func:`save_live` wrote (``ObjectNotFound`` if none)."""
    return BatchState.from_dict(unseal(secret, store.read_bytes(live_key(group_id)), group_id))


def driven_key(group_id: str) -> str:
    return f"_groups/{group_id}/driven.json"


def save_driven(store: ObjectStore, state: BatchState, secret: bytes) -> None:
    """The state of a batch its trigger drives (sealed), bumping ``seq``: a trigger
    re-created after a triggerer restart continues from here, not from the state
    it was deferred with.  Written when the state changed, at most every few
    seconds (``triggers.batch``), so it costs O(polls), not O(children)."""
    state.seq += 1
    _write_sealed(store, driven_key(state.group_id), state, secret)


def load_driven(store: ObjectStore, state: BatchState, secret: bytes) -> BatchState:
    """The newest saved state of the deferral that ``state`` came from (``driver``), or
    ``state`` itself: a save of another deferral or try is never taken."""
    try:
        raw = store.read_bytes(driven_key(state.group_id))
    except ObjectNotFound:
        return state
    saved = BatchState.from_dict(unseal(secret, raw, state.group_id))
    if saved.driver != state.driver or saved.seq <= state.seq:
        return state
    log.info(
        "batch %s: continuing from the state its trigger saved (#%d)", state.group_id, saved.seq
    )
    return saved


def _latest_launch(store: ObjectStore, group_id: str, index: int) -> int:
    launch = 0
    while store.exists(
        artifact_key(batchrun.child_job_id(group_id, index, launch + 1), "handle.json")
    ):
        launch += 1
    return launch


def resume_batch(
    store: ObjectStore,
    backend: Backend,
    config: KineticConfig,
    group_id: str,
    secret: bytes,
    result_key: Callable[[JobHandle], str | None],
    *,
    cancel_live: bool,
) -> BatchState:
    """The batch's state rebuilt from the store and the backend (see module docstring)."""
    state = BatchState.from_dict(unseal(secret, store.read_bytes(plan_key(group_id)), group_id))
    state.queue, state.order, state.stopped = [], [], False
    latest: dict[int, JobHandle] = {}
    for index in range(state.total):
        launch = _latest_launch(store, group_id, index)
        state.launches[index] = launch
        if launch:
            job_id = batchrun.child_job_id(group_id, index, launch)
            spec = batchrun.child_spec(state, index, job_id, config, store, secret)
            latest[index] = state.template.handle(config, store, spec, index)
            state.jobs[index] = job_id
    reports = backend.batch_status(group_id, list(latest.values())) if latest else {}
    for index in range(state.total):
        handle = latest.get(index)
        report = reports.get(handle.job_id) if handle else None
        if handle is None or report is None:
            state.queue.append(index)
            continue
        if report.status in (JobStatus.PENDING, JobStatus.RUNNING):
            if cancel_live and not cancel_requested(store, handle):
                request_cancel(store, backend, handle)
            if cancel_live or cancel_requested(store, handle):
                state.queue.append(index)
            else:
                state.active[index] = handle
                state.attempts[index] = 1
            continue
        if report.status is JobStatus.SUCCEEDED or (
            report.status is JobStatus.NOT_FOUND and succeeded_result(store, handle, result_key)
        ):
            state.done[index] = SUCCEEDED
            state.order.append(index)
            continue
        state.queue.append(index)  # failed, cancelled or gone: run it again
    state.manifest_dirty = True
    log.info(
        "batch %s resumed: %d succeeded, %d running adopted, %d to (re)submit",
        group_id,
        len(state.done),
        len(state.active),
        len(state.queue),
    )
    return state
