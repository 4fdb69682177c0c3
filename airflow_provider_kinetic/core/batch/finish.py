"""A finished batch's values, history entry and cleanup, the same from the map operator
and from the batch sensor (``core.jobs.cleanup`` is the policy).

With ``hold`` (a map task's try, whose record says "delivered" once the values are in
XCom) the ended inputs' artifacts the policy would delete are kept (history: "held")
until the try's record says it returned them (:func:`release_held`): a try ended in
between (Airflow terminating it) leaves a later try the same values to collect, as
``core.jobs.finish`` does for a single job."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import launchrecord
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.state import (
    CANCELLED,
    NOT_SUBMITTED,
    SUCCEEDED,
    BatchState,
)
from airflow_provider_kinetic.core.jobs import history, usage
from airflow_provider_kinetic.core.jobs.checkpoint import remove_checkpoints
from airflow_provider_kinetic.core.jobs.cleanup import after_job, deletes
from airflow_provider_kinetic.core.jobs.finish import HELD
from airflow_provider_kinetic.core.spec.handles import JobHandle, artifact_key
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)

#: The children's outcomes a batch's history entry names in its reason.
OUTCOMES = ("succeeded", "failed", "cancelled", "not_submitted")


@dataclass
class Gathered:
    """A finished batch's children: ``values`` (one per position; a failed position
    holds its exception) and ``failures`` (position -> exception)."""

    values: list[Any]
    failures: dict[int, BaseException]


def gather_values(
    state: BatchState,
    store: ObjectStore,
    *,
    ordered: bool,
    result_key: Callable[[str], str | None],
    deliver: Callable[[Any, str, bytes], Any],
) -> Gathered:
    """Every child's value, verified with ``result_key(job_id)`` and delivered as
    ``deliver(value, job_id, blob)`` makes it (``core.batch.outcomes.gather``); the
    manifest is written first when it is behind."""
    if state.manifest_dirty:
        batchmanifest.write_manifest(state, store)
    values, failures = batchoutcomes.gather(
        state, store, ordered=ordered, result_key=result_key, deliver=deliver
    )
    return Gathered(values, failures)


def batch_ended(
    state: BatchState,
    store: ObjectStore,
    backend: Backend,
    *,
    delivered: bool,
    cleanup: str,
    kept_uris: Iterable[str] = (),
    log_: Any = None,
    hold: bool = False,
) -> int:
    """Record how the batch ended (SUCCEEDED: its values were delivered, failed
    children among them with ``return_exceptions``; the reason counts them), then
    apply the policy to every job it created (retries too): a succeeded child's by
    the success rule, every other by the failure rule.  Returns how many artifact
    objects were deleted.

    Not ``delivered`` (the batch failed as a whole, nobody has its values): succeeded
    children are left exactly as they are, so a retry of the task resumes the batch
    and collects them instead of running them again.

    ``hold`` (``delivered`` only): what a later try needs to collect the same values
    again stays until :func:`release_held` (see the module)."""
    jobs = [JobHandle(job_id, state.backend, "") for job_id in _created(state)]
    ok = {state.jobs[i] for i, outcome in state.done.items() if outcome == SUCCEEDED}
    if not delivered:
        jobs, ok = [j for j in jobs if j.job_id not in ok], set()
    launchrecord.save_launches(store, state)  # before the policy may delete launch records
    _record(store, state, "SUCCEEDED" if delivered else "FAILED")
    held = held_results(state, store, cleanup, kept_uris) if hold and delivered else set()
    removed = after_job(
        store,
        backend,
        jobs,
        succeeded=ok,
        cleanup=cleanup,
        kept_uris=set(kept_uris) | held,
        entry_id=state.group_id,
        log_=log_,
    )
    if held:
        _note_held(store, state.group_id)
    if delivered and deletes(cleanup, True):  # done for good: nothing resumes from them
        try:
            remove_checkpoints(store, state.template.identity)
        except Exception as exc:  # noqa: BLE001 - the values are delivered already
            log.warning("could not delete the checkpoints of batch %s: %s", state.group_id, exc)
    return removed


def _created(state: BatchState) -> list[str]:
    """Every job the batch created (retries and earlier tries' launches too)."""
    return [
        batchlaunch.child_job_id(state.group_id, index, launch)
        for index, launches in sorted(state.launches.items())
        for launch in range(1, launches + 1)
    ]


def _record(store: ObjectStore, state: BatchState, ended: str, why: str = "") -> None:
    """The batch's history entry says how it ended: ``ended`` with its children counted
    in the reason, each child's outcome (``child_states``: what ``jobs list
    --children`` and the Kinetic tab show once its backend forgot it), and what
    ``jobs cleanup`` and the holds read.  A frozen usage (an earlier try's end) is
    dropped first: the policy freezes this end's, every child counted."""
    counts = batchrun.counts(state)
    ids = _created(state)
    ok = {state.jobs[i] for i, outcome in state.done.items() if outcome == SUCCEEDED}
    reason = ", ".join(f"{counts[k]} {k}" for k in OUTCOMES if counts.get(k)) or None
    if why:
        reason = f"{why}: {reason}" if reason else why
    history.update(
        store,
        state.group_id,
        ended,
        reason,
        children=counts,
        # ``jobs cleanup``: whose failed artifacts expire, whose archived logs go with
        # the entry.
        child_jobs=ids,
        failed_jobs=[job_id for job_id in ids if job_id not in ok],
        child_states={
            str(i): {"job_id": state.jobs[i], "state": state.done[i]}
            for i in sorted(state.done)
            if i in state.jobs
        },
        preemptions=sum(state.preemptions.values()),
        # ``core.jobs.holds``: a batch that failed as a whole holds these for a retry.
        succeeded_children={
            state.jobs[i]: i for i, o in state.done.items() if o == SUCCEEDED and i in state.jobs
        },
        usage=None,
    )


def batch_cancelled(state: BatchState, store: ObjectStore, why: str) -> None:
    """A batch stopped from outside (its task marked failed or cleared, a timeout):
    once its running children were cancelled (``request_cancel``), they are counted
    CANCELLED, the manifest names every child and the history entry says how it
    ended, its usage frozen.  Nothing is deleted: a retry resumes the batch (its
    succeeded children are collected, not run again) and ``jobs cleanup`` applies the
    retention.  ``state`` itself is left as it is (a copy is counted): the try's own
    loop may still be reading it.  Never raises (the task is being stopped)."""
    try:
        state = BatchState.from_dict(state.to_dict())
        for index in list(state.active):
            state.done.setdefault(index, CANCELLED)
            state.order.append(index)
        state.active.clear()
        for index in state.queue:
            state.done.setdefault(index, NOT_SUBMITTED)
        state.queue.clear()
        batchmanifest.write_manifest(state, store)
        launchrecord.save_launches(store, state)
        _record(store, state, history.CANCELLED, why)
        usage.record_usage(store, state.group_id)
    except Exception as exc:  # noqa: BLE001 - history never fails a job
        log.warning("could not record the end of batch %s: %s", state.group_id, exc)


def batch_resumed(store: ObjectStore, group_id: str, identity: Mapping[str, Any]) -> None:
    """A later try of the task took the batch over: its entry is running again under
    that try (its number as Airflow shows it), the earlier end's time and usage
    dropped, so the end this try records is the one shown."""
    try_number = identity.get("try_number")
    history.update(
        store,
        group_id,
        history.SUBMITTED,
        f"resumed by try {try_number}" if try_number is not None else "resumed",
        create=False,
        try_number=try_number,
        ended_at=None,
        usage=None,
    )


def held_results(
    state: BatchState, store: ObjectStore, cleanup: str, kept_uris: Iterable[str] = ()
) -> set[str]:
    """The result URIs whose jobs a delivered batch's end holds: each ended input's
    latest job (what its value, or its error, is collected from again) whose
    artifacts the policy deletes and no XCom reference keeps anyway."""
    kept = set(kept_uris)
    uris = {
        store.uri(artifact_key(state.jobs[index], "result.pkl"))
        for index, outcome in state.done.items()
        if index in state.jobs and deletes(cleanup, outcome == SUCCEEDED)
    }
    return uris - kept


def _note_held(store: ObjectStore, group_id: str) -> None:
    """The batch's history entry says its artifacts are held (what is left, as the
    policy counted it, stays as it is)."""
    entry = history.read(store, group_id) or {}
    artifacts = dict(entry.get("artifacts") or {})
    history.update(store, group_id, artifacts={**artifacts, "state": HELD})


def release_held(
    state: BatchState,
    store: ObjectStore,
    backend: Backend,
    *,
    cleanup: str,
    kept_uris: Iterable[str] = (),
    log_: Any = None,
) -> int:
    """Once the try's record says the values were returned: the policy applied to the
    batch's jobs as ``batch_ended`` would have without ``hold`` (what it held goes,
    the history entry says what is left).  Never fatal: the values are home; ``jobs
    cleanup`` deletes what is left.  Returns how many artifact objects were deleted."""
    if not held_results(state, store, cleanup, kept_uris):
        return 0
    jobs = [JobHandle(job_id, state.backend, "") for job_id in _created(state)]
    ok = {state.jobs[i] for i, outcome in state.done.items() if outcome == SUCCEEDED}
    try:
        return after_job(
            store,
            backend,
            jobs,
            succeeded=ok,
            cleanup=cleanup,
            kept_uris=kept_uris,
            entry_id=state.group_id,
            log_=log_,
        )
    except Exception as exc:  # noqa: BLE001 - the values are home already
        (log_ or log).warning(
            "could not delete the held artifacts of batch %s: %s", state.group_id, exc
        )
        return 0
