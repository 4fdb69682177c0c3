"""A batch's launch record (``_groups/{id}/launches.json``) and what a driver that may
restart decides from it: each child's create intent, recorded before its create.

A driven batch's trigger may die between any two calls and is re-made from an older
saved state.  So a child's create has a record on each side, neither an object per
child: before a wave of creates the launch record names the next launch of every
queued input (:func:`intend`: one write for the whole queue at the start, one per
wave of relaunches), and once the create was answered the child writes its own
``handle.json`` (``jobs.submit.create_child``).  A probing driver decides per child
by a :class:`ChildProbe`; an input that a driver before it moved on to a later
launch is followed there (:func:`follow`).  The record also keeps how many jobs each
input had when the batch ended (:func:`save_launches`), which a resumed try reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.spec.handles import (
    JobHandle,
    JobStatus,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)


def launches_key(group_id: str) -> str:
    return f"_groups/{group_id}/launches.json"


#: What an input carries into a relaunch (its counts as it was queued for it).
CARRIED = ("attempts", "steps", "preemptions")


@dataclass
class LaunchRecord:
    """The batch's launch record (:func:`launches_key`).  Not sealed, like the rest of
    a batch's bookkeeping that only steers probes: a missing or wrong entry makes a
    driver probe a job id that does not exist, or treat a launch as never created
    (its create then meets the child's own object and keeps it,
    ``jobs.submit.create_child``); every result is still read from its sealed record.

    ``launches``: the jobs each input had when the batch ended (:func:`save_launches`);
    ``intended``: the highest launch of each input whose create intent was recorded,
    before its create (:func:`intend`); ``carried``: for an intended relaunch, the
    input's counts as it was queued for it (``CARRIED``), so a driver that follows
    it (:func:`follow`) counts its attempts as the driver that queued it did."""

    launches: dict[int, int] = field(default_factory=dict)
    intended: dict[int, int] = field(default_factory=dict)
    carried: dict[int, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def read(cls, store: ObjectStore, group_id: str) -> LaunchRecord:
        """The record (empty parts: none, or unreadable)."""
        try:
            body = json.loads(store.read_bytes(launches_key(group_id)))
        except (ObjectNotFound, ValueError):
            body = {}
        body = body if isinstance(body, dict) else {}
        record = cls()
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            record.launches = {int(i): int(n) for i, n in (body.get("launches") or {}).items()}
        try:
            record.intended = {int(i): int(n) for i, n in (body.get("intended") or {}).items()}
            record.carried = {
                int(i): {k: int(c[k]) for k in CARRIED if k in c}
                for i, c in (body.get("carried") or {}).items()
            }
        except (ValueError, TypeError, AttributeError):
            record.intended, record.carried = {}, {}
        return record

    def write(self, store: ObjectStore, group_id: str) -> None:
        body = {
            "group_id": group_id,
            "launches": {str(i): n for i, n in sorted(self.launches.items())},
            "intended": {str(i): n for i, n in sorted(self.intended.items())},
            "carried": {str(i): c for i, c in sorted(self.carried.items())},
        }
        store.write_bytes(launches_key(group_id), json.dumps(body, sort_keys=True).encode())


def save_launches(store: ObjectStore, state: BatchState) -> None:
    """Record how many jobs each input had when the batch ended, before the cleanup
    policy may delete their ``handle.json``: a resumed try then finds its succeeded
    children past a failed launch whose artifacts went (``resume.resume_batch``).
    Not sealed: a wrong count only makes resume probe a job id that does not exist
    (run again) and every success is still read from its sealed record.  The create
    intents the record holds are kept."""
    record = LaunchRecord.read(store, state.group_id)
    for i, n in state.intended.items():
        record.intended[i] = max(n, record.intended.get(i, 0))
    record.launches = dict(state.launches)
    record.write(store, state.group_id)


def read_launches(store: ObjectStore, group_id: str) -> dict[int, int]:
    """What :func:`save_launches` recorded (empty: nothing, or unreadable)."""
    return LaunchRecord.read(store, group_id).launches


@dataclass(frozen=True)
class ChildProbe:
    """What a driver that may have restarted finds of one child's derived job before it
    would create it, and so what it does (:func:`probe_child`).

    ``intended``: the batch's launch record names this launch (its create intent,
    written before the create, by a driver before this one); ``created``: its
    ``handle.json``, written once its create was answered; ``present``: its object on
    the backend, proven its own; ``ended``: it left a result payload.  Only a child
    that was never created, or whose create was never answered and that left
    nothing (it cannot have run to a result, and does not run now), is created."""

    index: int
    job_id: str
    intended: bool
    created: bool
    present: bool
    ended: bool

    @property
    def adopt(self) -> bool:
        return self.created or self.present or self.ended

    @property
    def describe(self) -> str:
        if self.present:
            return "was created already and its job is there: adopted"
        if self.adopt:
            return "was created and its job is gone: adopted as it ended, not created again"
        if self.intended:
            return "has a create intent but was never created (or its create never answered)"
        return "was never created"


def probe_child(
    state: BatchState,
    store: ObjectStore,
    backend: Backend,
    handle: JobHandle,
    index: int,
    launch_no: int,
) -> ChildProbe:
    """:class:`ChildProbe` of ``handle``, input ``index``'s ``launch_no``-th job.  A
    launch no driver recorded the intent of was never created: no call is made for
    it; else the store first, the backend only when the store has no record."""
    intended = state.intended.get(index, 0) >= launch_no
    created = intended and store.exists(artifact_key(handle.job_id, "handle.json"))
    present = intended and not created and backend.exists(handle)
    ended = (
        intended
        and not (created or present)
        and store.exists(artifact_key(handle.job_id, "result.pkl"))
    )
    return ChildProbe(index, handle.job_id, intended, created, present, ended)


def intend(state: BatchState, store: ObjectStore) -> None:
    """Record the create intent of the next launch of every queued input, before any of
    them is created: one write of the batch's launch record (:class:`LaunchRecord`)
    for a whole wave (at the start, every input; later, the inputs queued again), not
    an object per child.  Merged with what the record holds (a driver before this one
    may have intended more); the launches it adds are this process's own, except in a
    batch an older version drove (``BatchState.pre_intent``): its driver created
    children without recording an intent, so a launch of an input the record names
    none of is not known to be uncreated, and is probed before its create
    (:func:`probe_child`: adopted if its object is there and proven its own, or it
    left a result; created only if it is missing)."""
    record = LaunchRecord.read(store, state.group_id)
    before = dict(record.intended)
    for i, n in state.intended.items():
        before[i] = max(n, before.get(i, 0))
    record.intended = dict(before)
    own: set[tuple[int, int]] = set()
    unsure: list[int] = []
    for index in state.queue:
        launch_no = state.launches.get(index, 0) + 1
        if before.get(index, 0) < launch_no:
            record.intended[index] = launch_no
            if state.pre_intent and index not in before:
                unsure.append(index)
            else:
                own.add((index, launch_no))
            if launch_no > 1:
                record.carried[index] = {k: getattr(state, k).get(index, 0) for k in CARRIED}
    if record.intended != before:
        record.write(store, state.group_id)
    if unsure:
        log.warning(
            "batch %s was driven by a version that recorded no create intents: "
            "%d inputs (%s) are probed on the cluster before they are created",
            state.group_id,
            len(unsure),
            ", ".join(map(str, unsure[:10])) + (", ..." if len(unsure) > 10 else ""),
        )
    state.intended = record.intended
    state.own_intents |= own


def follow(state: BatchState, reports: dict[str, StatusReport], store: ObjectStore) -> list[int]:
    """Inputs whose running child (as a state older than the batch knows it) is gone
    because the input moved on: a driver before this one saw it end (preempted,
    failed and retried, a capacity step), deleted it and recorded the intent of a
    later launch.  Each is queued again at the latest launch the record names
    (probed, so adopted if it was created), with the counts it was queued with
    (``LaunchRecord.carried``), not judged by its old job's absence: a running input
    is never marked FAILED for the job it left."""
    moved: list[int] = []
    record: LaunchRecord | None = None
    for index, handle in list(state.active.items()):
        report = reports.get(handle.job_id)
        if report is None or report.status is not JobStatus.NOT_FOUND:
            continue
        later = state.intended.get(index, 0)
        if later <= state.launches.get(index, 0):
            continue
        record = record or LaunchRecord.read(store, state.group_id)
        del state.active[index]
        state.launches[index] = later - 1  # every launch between ended, and is gone
        for name, count in record.carried.get(index, {}).items():
            getattr(state, name)[index] = count
        state.queue.insert(0, index)
        moved.append(index)
        log.warning(
            "inputs[%d] (%s) is gone and the batch's launch record names its launch %d: "
            "following it",
            index,
            handle.job_id,
            later,
        )
    return moved
