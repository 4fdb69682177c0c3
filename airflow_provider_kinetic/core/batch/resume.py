"""Batches resume: a retried or re-run map task reattaches to its group.

The plan (the initial ``BatchState``: template, options, inputs) is written once per
batch, sealed with the deployment secret, at ``_groups/{group_id}/state.json``.
Children have derived job ids (``batchlaunch.child_job_id``), so a new try finds every
child the earlier tries created by probing ``{job_id}/handle.json`` — no per-child
record, so a batch still writes N + c objects.  Then the try-rule applies per child:
succeeded children are collected, running ones adopted (unless the earlier try was
deferred and killed from outside: then they are cancelled and run again), and only
failed, cancelled or missing ones are submitted again.

A batch whose values were delivered by a try that ended before it returned them (a
termination while finishing) is not resumed but collected again: its ended state,
saved (as the live state) before the values went to XCom, names every input's job and
outcome, so a later try delivers the same values (:func:`delivered_state`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import journal, launchrecord
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.signing import seal, unseal
from airflow_provider_kinetic.core.jobs.taskrecord import (
    cancel_requested,
    request_cancel,
    succeeded_result,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
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


def delivered_state(store: ObjectStore, group_id: str, secret: bytes) -> BatchState | None:
    """The ended state a try saved before it delivered the batch's values (the live
    state, every input ended); None when there is none to collect from (then the batch
    is resumed: succeeded inputs are collected, only the others run again)."""
    try:
        state = load_live(store, group_id, secret)
    except Exception as exc:  # noqa: BLE001 - absent, unreadable or forged: resume instead
        log.warning("batch %s: no delivered state to collect again (%s)", group_id, exc)
        return None
    if not state.finished or len(state.done) != state.total:
        log.warning("batch %s: its saved state has not ended; resuming it", group_id)
        return None
    return state


def driven_key(group_id: str) -> str:
    return f"_groups/{group_id}/driven.json"


def save_driven(store: ObjectStore, state: BatchState, secret: bytes) -> None:
    """A full snapshot of the state of a batch its trigger drives (sealed), bumping
    ``seq``: the base that later deltas (``core.batch.journal``) apply to.  Saves are
    mostly deltas (:class:`DrivenSaves`); a snapshot only bounds a restart's reads."""
    state.seq += 1
    _write_sealed(store, driven_key(state.group_id), state, secret)


def _load_driven(store: ObjectStore, state: BatchState, secret: bytes) -> tuple[BatchState, int]:
    base = state
    try:
        raw = store.read_bytes(driven_key(state.group_id))
    except ObjectNotFound:
        raw = None
    if raw is not None:
        saved = BatchState.from_dict(unseal(secret, raw, state.group_id))
        if saved.driver == state.driver and saved.seq > state.seq:
            base = saved
    if not state.driver:
        return base, 0
    value, applied = journal.replay(store, state.group_id, state.driver, base.to_dict(), secret)
    latest = BatchState.from_dict(value) if applied else base
    if latest is not state:
        log.info(
            "batch %s: continuing from the state its trigger saved (#%d)",
            state.group_id,
            latest.seq,
        )
    return latest, applied


def load_driven(store: ObjectStore, state: BatchState, secret: bytes) -> BatchState:
    """The newest saved state of the deferral that ``state`` came from (``driver``): its
    newest snapshot, or ``state`` itself, with that deferral's later deltas applied.
    A save of another deferral or try is never taken."""
    return _load_driven(store, state, secret)[0]


class DrivenSaves:
    """One driver's saves of its batch: each a delta against the previous save (its
    bytes follow what changed, not the batch's size), every
    ``journal.SNAPSHOT_EVERY``-th a full snapshot."""

    def __init__(self, store: ObjectStore, secret: bytes) -> None:
        self.store, self.secret = store, secret
        self.last: dict | None = None  # the dict form of the newest save (or the base)
        self.chain = 0  # deltas since the newest snapshot (or the base)

    def load(self, state: BatchState) -> BatchState:
        """``state`` (the deferral's) brought up to its newest save; deltas go on from it."""
        latest, self.chain = _load_driven(self.store, state, self.secret)
        self.last = json.loads(json.dumps(latest.to_dict()))
        return latest

    def save(self, state: BatchState) -> None:
        if self.last is None or self.chain >= journal.SNAPSHOT_EVERY or not state.driver:
            save_driven(self.store, state, self.secret)
            self.chain = 0
            self.last = json.loads(json.dumps(state.to_dict()))
            return
        state.seq += 1
        new = state.to_dict()
        changes = journal.diff(self.last, new)
        journal.write_delta(
            self.store, state.group_id, state.driver, state.seq, changes, self.secret
        )
        self.chain += 1
        # A copy: the wire form shares inner lists with the live state, and a list
        # changed in place later must still differ from what was saved.
        self.last = json.loads(json.dumps(new))


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
    recorded = launchrecord.read_launches(store, group_id)  # an ended try's, if any
    for index in range(state.total):
        launch = batchlaunch.latest_launch(store, group_id, index, recorded.get(index, 0))
        state.launches[index] = launch
        if launch:
            job_id = batchlaunch.child_job_id(group_id, index, launch)
            spec = batchlaunch.child_spec(state, index, job_id, config, store, secret)
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
