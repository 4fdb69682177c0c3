"""Launching a planned batch's children: the batch's start (uploads, manifest, history
entry), each child's derived job id and spec, launches under the cap (a probing driver
adopts a child created before it restarted, by the create intents of the batch's launch
record, ``core.batch.launchrecord``), and the recovery of an input the state lost
track of.

What each launched child then ends as is ``core.batch.run``'s (it folds their statuses
into the state); everything works on the :class:`BatchState` from
``core.batch.plan_batch`` (JSON on the wire), so the operator can carry it across
deferrals.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch.launchrecord import intend, probe_child
from airflow_provider_kinetic.core.batch.manifest import write_manifest
from airflow_provider_kinetic.core.batch.plan import PAYLOAD_CACHE
from airflow_provider_kinetic.core.batch.state import FAILED, BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.history import DATA_HASHES
from airflow_provider_kinetic.core.jobs.outputs import start_empty
from airflow_provider_kinetic.core.jobs.submit import create_child, make_private, write_handle
from airflow_provider_kinetic.core.runtime.context import CONTEXT_CACHE
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)


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

    A child's ``handle.json`` is written once its create was answered
    (``jobs.submit.create_child``).  ``probe`` (a driver that may restart: the
    trigger's): each child's create intent is in the batch's launch record before
    its create (:func:`intend`: one write per wave, not per child), and the state
    may be older than the batch (a trigger re-created after a triggerer restart
    starts from its last saved state): a launch a driver before this one intended
    is probed first (:func:`probe_child`) and adopted if it was created, so no
    input ever runs twice; one no driver intended was never created.  A driver
    that cannot restart (the worker's own wait) records no intent.  ``halted``:
    asked before each launch; once true, the rest stay queued (a trigger being
    stopped).

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
        if probe and state.intended.get(index, 0) < launch_no:
            intend(state, store)  # raises: the input stays queued, asked again
        try:
            found = None
            if probe and (index, launch_no) not in state.own_intents:
                found = probe_child(state, store, backend, handle, index, launch_no)
                log.info("inputs[%d] (%s) %s", index, job_id, found.describe)
            if found is not None and found.adopt:
                if found.present and not found.created:
                    write_handle(store, handle)  # created, its record not yet written
            else:
                if launch_no > 1:  # the input's earlier job left its files there
                    start_empty(store, state.template.output_uri(index), f"inputs[{index}]")
                create_child(store, backend, spec, handle)
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
        state.own_intents.discard((index, launch_no))
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


def latest_launch(store: ObjectStore, group_id: str, index: int, recorded: int = 0) -> int:
    """How many of input ``index``'s derived jobs were created (each has its
    ``handle.json`` from once its create was answered): the batch's own launch records, from
    ``recorded`` on (the count ``launchrecord.save_launches`` kept, so a launch whose
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
    newer than the last one the state recorded for the input (``jobs``) has its
    ``handle.json`` (written once its create was answered), so it was created and
    not recorded: it is adopted as it is; else the input is queued first and
    launched once, under the next id (probed by a probing driver, :func:`launch`).
    Either way it is said as the error of ours it is.  A batch fail_fast stopped
    launches nothing more: its report names such an input."""
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
