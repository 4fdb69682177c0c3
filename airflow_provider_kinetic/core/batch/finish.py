"""A finished batch's values, history entry and cleanup, the same from the map operator
and from the batch sensor (``core.jobs.cleanup`` is the policy).

With ``hold`` (a map task's try, whose record says "delivered" once the values are in
XCom) the ended inputs' artifacts the policy would delete are kept (history: "held")
until the try's record says it returned them (:func:`release_held`): a try ended in
between (Airflow terminating it) leaves a later try the same values to collect, as
``core.jobs.finish`` does for a single job."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.jobs import history
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
    mode: str,
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
    jobs = [
        JobHandle(batchlaunch.child_job_id(state.group_id, index, launch), state.backend, "")
        for index, launches in state.launches.items()
        for launch in range(1, launches + 1)
    ]
    ok = {state.jobs[i] for i, outcome in state.done.items() if outcome == SUCCEEDED}
    ids = [job.job_id for job in jobs]
    if not delivered:
        jobs, ok = [j for j in jobs if j.job_id not in ok], set()
    counts = batchrun.counts(state)
    batchlaunch.save_launches(store, state)  # before the policy may delete launch records
    history.update(
        store,
        state.group_id,
        "SUCCEEDED" if delivered else "FAILED",
        ", ".join(f"{counts[k]} {k}" for k in OUTCOMES if counts.get(k)) or None,
        children=counts,
        # ``jobs cleanup``: whose failed artifacts expire, whose archived logs go with
        # the entry.
        child_jobs=ids,
        failed_jobs=[job_id for job_id in ids if job_id not in ok],
        preemptions=sum(state.preemptions.values()),
        # ``core.jobs.holds``: a batch that failed as a whole holds these for a retry.
        succeeded_children={
            state.jobs[i]: i for i, o in state.done.items() if o == SUCCEEDED and i in state.jobs
        },
    )
    held = held_results(state, store, mode, kept_uris) if hold and delivered else set()
    removed = after_job(
        store,
        backend,
        jobs,
        succeeded=ok,
        mode=mode,
        kept_uris=set(kept_uris) | held,
        entry_id=state.group_id,
        log_=log_,
    )
    if held:
        _note_held(store, state.group_id)
    if delivered and deletes(mode, True):  # done for good: nothing resumes from them
        try:
            remove_checkpoints(store, state.template.identity)
        except Exception as exc:  # noqa: BLE001 - the values are delivered already
            log.warning("could not delete the checkpoints of batch %s: %s", state.group_id, exc)
    return removed


def held_results(
    state: BatchState, store: ObjectStore, mode: str, kept_uris: Iterable[str] = ()
) -> set[str]:
    """The result URIs whose jobs a delivered batch's end holds: each ended input's
    latest job (what its value, or its error, is collected from again) whose
    artifacts the policy deletes and no XCom reference keeps anyway."""
    kept = set(kept_uris)
    uris = {
        store.uri(artifact_key(state.jobs[index], "result.pkl"))
        for index, outcome in state.done.items()
        if index in state.jobs and deletes(mode, outcome == SUCCEEDED)
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
    mode: str,
    kept_uris: Iterable[str] = (),
    log_: Any = None,
) -> int:
    """Once the try's record says the values were returned: the policy applied to the
    batch's jobs as ``batch_ended`` would have without ``hold`` (what it held goes,
    the history entry says what is left).  Never fatal: the values are home; ``jobs
    cleanup`` deletes what is left.  Returns how many artifact objects were deleted."""
    if not held_results(state, store, mode, kept_uris):
        return 0
    jobs = [
        JobHandle(batchlaunch.child_job_id(state.group_id, index, launch), state.backend, "")
        for index, launches in state.launches.items()
        for launch in range(1, launches + 1)
    ]
    ok = {state.jobs[i] for i, outcome in state.done.items() if outcome == SUCCEEDED}
    try:
        return after_job(
            store,
            backend,
            jobs,
            succeeded=ok,
            mode=mode,
            kept_uris=kept_uris,
            entry_id=state.group_id,
            log_=log_,
        )
    except Exception as exc:  # noqa: BLE001 - the values are home already
        (log_ or log).warning(
            "could not delete the held artifacts of batch %s: %s", state.group_id, exc
        )
        return 0
