"""kinetic's batch manifest (``_groups/{group_id}/manifest.json``: the group's fields
and one entry per submitted child), rewritten a bounded number of times while a batch
runs, and the handle that stands for a batch in XCom."""

from __future__ import annotations

import json
import time
from typing import Any

from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.storage import ObjectStore

MANIFEST_INTERVAL_S = 30.0
#: Rewrites of the manifest while a batch runs, at most (its size is O(N) each time).
MANIFEST_REWRITES = 16


def write_manifest(state: BatchState, store: ObjectStore) -> None:
    """kinetic's manifest: group fields + one entry per submitted child."""
    children = [
        {"group_index": i, "job_id": job, "attempts": state.attempts.get(i, 1)}
        for i, job in sorted(state.jobs.items())
    ]
    manifest = {
        "group_id": state.group_id,
        "group_kind": "map",
        "group_name": state.group_name,
        "tags": state.tags,
        "created_at": state.created_at,
        "total_expected": state.total,
        "submit_fn_name": state.template.func_name,
        "children": children,
    }
    store.write_bytes(
        manifest_key(state.group_id),
        json.dumps(manifest, sort_keys=True).encode(),
        content_type="application/json",
    )
    state.manifest_at = time.time()
    state.manifest_dirty = False
    state.manifest_count = len(state.jobs)


def manifest_key(group_id: str) -> str:
    return f"_groups/{group_id}/manifest.json"


def batch_handle(state: BatchState, store: ObjectStore) -> dict[str, Any]:
    """What stands for a submitted batch in XCom (``KineticBatchSensor`` waits on it):
    the group id finds its saved state, the rest is for people."""
    return {
        "kind": "kinetic_batch",
        "group_id": state.group_id,
        "backend": state.backend,
        "bucket": store.bucket,
        "total": state.total,
        "output_dir": state.template.output_dir,
        "manifest_uri": store.uri(manifest_key(state.group_id)),
    }


def batch_status(state: BatchState, store: ObjectStore, counts: dict[str, Any]) -> dict[str, Any]:
    """The ``kinetic_batch`` XCom: the batch's counts now (``core.batch.run.counts``)
    and where its manifest and outputs are; pushed by the worker as counts change and
    by a trigger that ends the task (``triggers.end_batch``)."""
    return {
        "group_id": state.group_id,
        "bucket": store.bucket,
        "manifest_uri": store.uri(manifest_key(state.group_id)),
        "output_dir": state.template.output_dir,
        "counts": counts,
    }


def maybe_write_manifest(state: BatchState, store: ObjectStore, now: float | None = None) -> bool:
    """Rewrite the manifest when children changed, the interval passed and another
    ``1/MANIFEST_REWRITES`` of the inputs was submitted since (or at the end): each
    rewrite is O(N) bytes, so a batch makes a bounded number of them whatever its
    length, not one every interval (N + c writes in all)."""
    if not state.manifest_dirty:
        return False
    now = time.time() if now is None else now
    step = -(-state.total // MANIFEST_REWRITES)
    if state.queue and (
        now - state.manifest_at < MANIFEST_INTERVAL_S
        or len(state.jobs) - state.manifest_count < step
    ):
        return False
    write_manifest(state, store)
    return True
