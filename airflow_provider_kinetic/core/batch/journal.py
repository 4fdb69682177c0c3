"""A driven batch's saves as a chain of deltas: each save writes what changed.

The trigger that drives a deferred batch saves its state so that a trigger re-created
after a triggerer restart continues from it (``triggers.batch_drive``).  Writing the
whole ``BatchState`` at every save made a 10,000-input batch write megabytes per
save, O(N) bytes each time and O(N^2) over the batch.  A save now writes only the
entries that changed since the previous save of the same deferral, as one sealed
object ``_groups/{id}/driven/{driver}/{seq}.json``; the base of the chain is the
state the deferral started with (the trigger's own kwargs, always at hand) or the
last full snapshot (``driven.json``, ``resume.save_driven``), written when the
chain since the previous one grew to ``SNAPSHOT_EVERY`` deltas, so a restart reads
a bounded number of objects.

Why objects, not an appended log: an object store has no append, and a sealed
object per save is written atomically (present means complete), like every other
record of a batch.  Why a diff of two dict forms rather than change tracking in
``core.batch.launch`` and ``core.batch.run``: the wire form is the one thing every
field already has, so a field added later travels in deltas without code here.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.jobs.signing import seal, unseal
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

#: Deltas after which the next save is a full snapshot (bounds a restart's reads).
SNAPSHOT_EVERY = 32
#: Fields kept whole in a delta: small, and not keyed per input.
_WHOLE = frozenset({"template"})
_MISSING = object()


def delta_key(group_id: str, driver: str, seq: int) -> str:
    return f"_groups/{group_id}/driven/{driver}/{seq:06d}.json"


def runs(values: list[int]) -> list[list[int]]:
    """``values`` as [first, last] runs of consecutive ints: a queue of 10,000 inputs
    waiting in order is one pair, not 10,000 numbers."""
    out: list[list[int]] = []
    for value in values:
        if out and isinstance(value, int) and value == out[-1][1] + 1:
            out[-1][1] = value
        else:
            out.append([value, value])
    return out


def unruns(pairs: list[list[int]]) -> list[int]:
    return [v for first, last in pairs for v in range(first, last + 1)]


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What turns ``old`` into ``new`` (two ``BatchState.to_dict()`` forms): per field,
    the changed and removed keys of a dict, the appended tail of a list that only
    grew, a queue as runs, anything else whole."""
    changes: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if before == value:
            continue
        if isinstance(value, dict) and isinstance(before, dict) and key not in _WHOLE:
            changes[key] = {
                "set": {k: v for k, v in value.items() if before.get(k, _MISSING) != v},
                "del": [k for k in before if k not in value],
            }
        elif (
            isinstance(value, list)
            and isinstance(before, list)
            and len(value) > len(before)
            and value[: len(before)] == before
        ):
            changes[key] = {"append": value[len(before) :]}
        elif key == "queue" and all(isinstance(v, int) for v in value):
            changes[key] = {"runs": runs(value)}
        else:
            changes[key] = {"value": value}
    gone = [key for key in old if key not in new]
    if gone:
        changes["__gone__"] = gone
    return changes


def apply(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` (from :func:`diff`) applied; ``base`` is not modified."""
    out = dict(base)
    for key in changes.get("__gone__", []):
        out.pop(key, None)
    for key, change in changes.items():
        if key == "__gone__":
            continue
        if "set" in change:
            merged = dict(out.get(key) or {})
            for k in change["del"]:
                merged.pop(k, None)
            merged.update(change["set"])
            out[key] = merged
        elif "append" in change:
            out[key] = list(out.get(key) or []) + change["append"]
        elif "runs" in change:
            out[key] = unruns(change["runs"])
        else:
            out[key] = change["value"]
    return out


def write_delta(
    store: ObjectStore, group_id: str, driver: str, seq: int, changes: dict, secret: bytes
) -> None:
    record = {"group_id": group_id, "driver": driver, "seq": seq, "changes": changes}
    store.write_bytes(
        delta_key(group_id, driver, seq), seal(secret, record), content_type="application/json"
    )


def replay(
    store: ObjectStore, group_id: str, driver: str, base: dict[str, Any], secret: bytes
) -> tuple[dict[str, Any], int]:
    """``base`` (at its ``seq``) with every later delta of ``driver`` applied, in order,
    up to the first one missing; returns the state's dict form and how many were
    applied.  A delta of another batch or deferral, or out of order, is refused."""
    state, applied = base, 0
    while True:
        seq = int(state.get("seq", 0)) + 1
        try:
            raw = store.read_bytes(delta_key(group_id, driver, seq))
        except ObjectNotFound:
            return state, applied
        record = unseal(secret, raw, f"batch {group_id} save #{seq}")
        if (record.get("group_id"), record.get("driver"), record.get("seq")) != (
            group_id,
            driver,
            seq,
        ):
            raise ValueError(f"batch {group_id}: save #{seq} names another batch or deferral")
        state = apply(state, record["changes"])
        state["seq"] = seq
        applied += 1
