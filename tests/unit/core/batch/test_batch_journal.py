"""A driven batch's saves are deltas (core.batch.journal, resume.DrivenSaves): each save
writes what changed, a restart rebuilds exactly the newest saved state from the
deferral's own state plus the deltas, and nothing of another deferral is taken.
The store is a real LocalStore."""

from __future__ import annotations

import json
import os

import pytest

from airflow_provider_kinetic.core.batch import journal
from airflow_provider_kinetic.core.batch.resume import DrivenSaves, driven_key, load_driven
from airflow_provider_kinetic.core.batch.state import FAILED, SUCCEEDED, BatchState
from airflow_provider_kinetic.core.jobs.signing import ResultAuthError
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.records import batch_state, handle

SECRET = os.urandom(32)


def _progress(state: BatchState, first: int, count: int) -> None:
    """``count`` children from ``first`` on end (one fails), the next ones start: what
    a driver's polls do to the state."""
    for index in range(first, first + count):
        state.active.pop(index, None)
        state.done[index] = FAILED if index == first else SUCCEEDED
        state.order.append(index)
        state.capacity_used[index] = "on-demand"
        state.log_offsets.pop(index, None)
    for _ in range(count):
        if state.queue:
            index = state.queue.pop(0)
            state.active[index] = handle(f"job-{index:05d}")
            state.jobs[index] = f"job-{index:05d}"
            state.attempts[index] = 1
            state.launches[index] = 1
            state.log_offsets[index] = [f"job-{index:05d}", 10 * index]


def _deferred(n: int) -> BatchState:
    """A batch as the operator defers it: its first children running, a driver token."""
    state = batch_state(n, {i: f"job-{i:05d}" for i in range(4)})
    state.launches = dict.fromkeys(range(4), 1)
    state.driver, state.seq = "deferral-1", 0
    return state


def test_runs_round_trip_any_queue() -> None:
    for queue in ([], [5], list(range(10_000)), [3, 0, 1, 2, 9, 10, 4], [7, 7, 8]):
        assert journal.unruns(journal.runs(queue)) == queue
    assert journal.runs(list(range(4, 10_000))) == [[4, 9_999]]


def test_diff_then_apply_gives_the_new_state() -> None:
    old = _deferred(50)
    new = BatchState.from_dict(json.loads(json.dumps(old.to_dict())))
    _progress(new, 0, 4)
    new.queue.insert(0, 0)  # a retry goes to the front
    new.stopped, new.extra["added_later"] = True, {"x": 1}
    changes = journal.diff(old.to_dict(), new.to_dict())
    assert journal.apply(old.to_dict(), changes) == new.to_dict()
    assert "template" not in changes  # unchanged fields are not written


def test_a_save_is_as_large_as_what_changed_not_the_batch(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    sizes = {}
    for n in (1_000, 10_000):
        state = _deferred(n)
        for first in range(0, n - 100, 100):  # most of the batch has run
            _progress(state, first, 100)
        saves = DrivenSaves(store, SECRET)
        state.group_id = f"grp-{n:08d}"
        state = saves.load(state)
        _progress(state, n - 100, 8)  # then one poll: 8 end, 8 start
        saves.save(state)
        key = journal.delta_key(state.group_id, state.driver, state.seq)
        sizes[n] = len(store.read_bytes(key)), len(json.dumps(state.to_dict()))
    (small_delta, small_whole), (big_delta, big_whole) = sizes[1_000], sizes[10_000]
    assert big_whole > 8 * small_whole  # the whole state grows with the batch ...
    assert big_delta < 1.2 * small_delta < small_whole / 10  # ... a save does not


def test_a_restart_rebuilds_the_newest_save_from_the_deferral_and_its_deltas(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    deferred = _deferred(300)
    kwargs = json.dumps(deferred.to_dict())  # what the re-created trigger gets back
    saves = DrivenSaves(store, SECRET)
    state = saves.load(BatchState.from_dict(json.loads(kwargs)))
    assert state.seq == 0
    for first in range(0, 200, 8):  # more saves than SNAPSHOT_EVERY: a snapshot between
        _progress(state, first, 8)
        saves.save(state)
    assert state.seq == 25 > journal.SNAPSHOT_EVERY // 2
    again = DrivenSaves(store, SECRET).load(BatchState.from_dict(json.loads(kwargs)))
    assert again.to_dict() == state.to_dict()
    # More saves than SNAPSHOT_EVERY since the base: the next is a snapshot, and a
    # restart after it starts there.
    for first in range(200, 290, 8):
        _progress(state, first, 8)
        saves.save(state)
    assert store.exists(driven_key(state.group_id))
    restarted = DrivenSaves(store, SECRET)
    assert restarted.load(BatchState.from_dict(json.loads(kwargs))).to_dict() == state.to_dict()
    assert restarted.chain < journal.SNAPSHOT_EVERY  # it read from the snapshot on
    # It goes on saving deltas where the dead one stopped.
    resumed = restarted.load(BatchState.from_dict(json.loads(kwargs)))
    _progress(resumed, 290, 4)
    restarted.save(resumed)
    assert (
        load_driven(store, BatchState.from_dict(json.loads(kwargs)), SECRET).to_dict()
        == resumed.to_dict()
    )


def test_deltas_of_another_deferral_are_never_taken(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    mine = _deferred(20)
    saves = DrivenSaves(store, SECRET)
    state = saves.load(BatchState.from_dict(json.loads(json.dumps(mine.to_dict()))))
    _progress(state, 0, 4)
    saves.save(state)
    other = BatchState.from_dict({**mine.to_dict(), "driver": "deferral-2"})
    assert load_driven(store, other, SECRET) is other
    assert (
        load_driven(store, BatchState.from_dict(json.loads(json.dumps(mine.to_dict()))), SECRET).seq
        == 1
    )


def test_an_altered_delta_is_refused(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    deferred = _deferred(20)
    saves = DrivenSaves(store, SECRET)
    state = saves.load(BatchState.from_dict(json.loads(json.dumps(deferred.to_dict()))))
    _progress(state, 0, 4)
    saves.save(state)
    key = journal.delta_key(state.group_id, state.driver, 1)
    store.write_bytes(key, store.read_bytes(key).replace(b"SUCCEEDED", b"SUCCEEDEX"))
    with pytest.raises(ResultAuthError):
        load_driven(store, BatchState.from_dict(json.loads(json.dumps(deferred.to_dict()))), SECRET)
