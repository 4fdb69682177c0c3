"""What is in a kinetic store: jobs (with the task that ran them) and data-cache entries.

The store is the only inventory there is (no database): every job writes
``{job_id}/handle.json``, every task's latest job is named by its sealed record under
``_airflow/tasks/{dag}/{run}/{task}/{map_index}.json``, and every complete data-cache
entry has a marker ``default/data-markers/{hash}``.  Reading these keeps the CLI
correct on every backend without asking the cluster for a list.

Nothing here imports Airflow: callers pass the deployment secret in.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from airflow_provider_kinetic.core.data.cache import CACHE_PREFIX, MARKER_PREFIX
from airflow_provider_kinetic.core.data.manifest import Manifest, ManifestError
from airflow_provider_kinetic.core.data.refs import TREES_PREFIX, tree_key
from airflow_provider_kinetic.core.durations import duration_s
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.signing import ResultAuthError, unseal
from airflow_provider_kinetic.core.jobs.taskrecord import RECORDS_PREFIX
from airflow_provider_kinetic.core.runtime.context import CONTEXT_CACHE
from airflow_provider_kinetic.core.spec.handles import InvalidHandleError, JobHandle
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore, file_uri_path
from airflow_provider_kinetic.core.storage._keys import PARTS_PREFIX
from airflow_provider_kinetic.core.storage.stat import stat_objects

log = logging.getLogger(__name__)

HANDLE_NAME = "handle.json"


class BadAge(ValueError):
    """An ``--older-than`` value that is not ``<number><s|m|h|d>``."""


def parse_age(text: str) -> float:
    """``7d`` / ``12h`` / ``30m`` / ``45s`` -> seconds; anything else names the bad value."""
    seconds = duration_s(text)
    if seconds is None:
        raise BadAge(
            f"bad age {text!r}: expected a number followed by s, m, h or d (e.g. 45s, 30m, 12h, 7d)"
        )
    return seconds


# ---- jobs -------------------------------------------------------------------------


@dataclass
class JobEntry:
    """A job found in the store and, when known, the Airflow task that ran it."""

    handle: JobHandle
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: str | None = None


def job_ids(store: ObjectStore) -> list[str]:
    """Ids of every job with a ``handle.json`` (single jobs and batch children)."""
    keys = store.list("job-")
    return [
        key[: -len(HANDLE_NAME) - 1]
        for key in keys
        if key.count("/") == 1 and key.endswith("/" + HANDLE_NAME)
    ]


def read_handle(store: ObjectStore, job_id: str) -> JobHandle | None:
    """The stored handle, or None when it is gone or unreadable (logged, not fatal:
    one bad file must not hide every other job)."""
    try:
        handle = JobHandle.from_dict(json.loads(store.read_bytes(f"{job_id}/{HANDLE_NAME}")))
    except ObjectNotFound:
        return None
    except (ValueError, InvalidHandleError) as exc:
        log.warning("skipping %s: %s", store.uri(f"{job_id}/{HANDLE_NAME}"), exc)
        return None
    return handle if handle.job_id == job_id else None


@dataclass
class TaskIndex:
    """Job id / group id -> (dag, run, task, map index), from the sealed task records."""

    by_job: dict[str, tuple[str, ...]] = field(default_factory=dict)
    by_group: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Job id -> (record key, the record's handle dict): the sealed record outlives
    #: the job's ``handle.json`` (deleted with its artifacts once the value is delivered).
    handles: dict[str, tuple[str, dict]] = field(default_factory=dict)

    def lookup(self, handle: JobHandle) -> tuple[str, ...] | None:
        found = self.by_job.get(handle.job_id)
        if found is None and handle.group_id:
            found = self.by_group.get(handle.group_id)
        return found


def task_index(store: ObjectStore, secret: bytes) -> TaskIndex:
    """Read every task record (superseded ones too: a cleared task's earlier jobs keep
    their task); records that fail their seal are ignored (the store is shared, and a
    forged record must not attach a job to someone else's DAG).  A record's exact ids
    are what it keeps; records of earlier versions have only their key, whose parts
    are the ids with unsafe characters replaced."""
    index = TaskIndex()
    for key in store.list(RECORDS_PREFIX + "/"):
        parts = key[len(RECORDS_PREFIX) + 1 :].split("/")
        if not key.endswith(".json") or len(parts) not in (4, 6):
            continue
        try:
            record = unseal(secret, store.read_bytes(key), store.uri(key))
        except (ResultAuthError, ObjectNotFound):
            continue
        exact = record.get("identity")
        if isinstance(exact, dict):
            identity = (
                str(exact.get("dag_id")),
                str(exact.get("run_id")),
                str(exact.get("task_id")),
                str(exact.get("map_index", -1)),
            )
        elif len(parts) == 4:
            # A record of an earlier version: its key is all it has.  Dag and task ids
            # are key-safe as they are; a run id's key form is not the id (``:`` and
            # ``+`` were replaced), and no page may show it as one: left unknown.
            identity = (parts[0], "", parts[2], parts[3][: -len(".json")])
        else:
            continue
        handle = record.get("handle")
        if isinstance(handle, dict) and handle.get("job_id"):
            index.by_job.setdefault(str(handle["job_id"]), identity)
            index.handles.setdefault(str(handle["job_id"]), (key, handle))
        if record.get("group_id"):
            index.by_group.setdefault(str(record["group_id"]), identity)
    return index


def dag_from_output_dir(output_dir: str | None) -> str | None:
    """``.../outputs/{dag}/{run}/{task}/{map_index}`` (the operators' default) -> ``dag``;
    None for any other layout (a plain submit's ``outputs/{job_id}`` names no DAG)."""
    if not output_dir:
        return None
    head, sep, tail = output_dir.partition("/outputs/")
    if not sep:
        head, sep, tail = output_dir.partition("outputs/")
        if not sep or head:
            return None
    parts = [p for p in tail.split("/") if p]
    if len(parts) < 4 or not parts[3].lstrip("-").isdigit():
        return None
    return parts[0]


def list_jobs(store: ObjectStore, secret: bytes, index: TaskIndex | None = None) -> list[JobEntry]:
    """Every job in the store, newest first, with its task when a record names it
    (else the DAG read from the default output dir layout).  ``index``: the task
    records, when the caller has read them already."""
    index = task_index(store, secret) if index is None else index
    entries = []
    for job_id in job_ids(store):
        handle = read_handle(store, job_id)
        if handle is None:
            continue
        entry = JobEntry(handle)
        identity = index.lookup(handle)
        if identity is not None:
            entry.dag_id, entry.run_id, entry.task_id, entry.map_index = identity
        else:
            entry.dag_id = dag_from_output_dir(handle.output_dir)
        entries.append(entry)
    entries.sort(key=lambda e: (e.handle.created_at, e.handle.job_id), reverse=True)
    return entries


def created_epoch(handle: JobHandle) -> float | None:
    """``created_at`` (kinetic's ``%Y-%m-%dT%H:%M:%SZ``) as epoch seconds."""
    return history.iso_epoch(handle.created_at)


def last_write(store: ObjectStore, job_id: str, record_key: str | None = None) -> str | None:
    """When an ended job last wrote to the store (its result, error or log), else when
    its task record was last written (its delivery): how it ended when nobody waiting
    recorded it; the store is the one record every backend keeps."""
    times = [mtime for _, mtime in stat_objects(store, f"{job_id}/").values()]
    if not times and record_key:
        found = stat_objects(store, record_key.rsplit("/", 1)[0] + "/").get(record_key)
        times = [found[1]] if found else []
    return history.now_iso(max(times)) if times else None


# ---- data cache -------------------------------------------------------------------


@dataclass
class CacheEntry:
    """One content hash in the data cache, or one cached job context archive."""

    content_hash: str
    complete: bool  # marker present (a context archive is one atomic object: always)
    marked_at: float | None  # marker mtime (epoch s); None when incomplete
    files: int
    bytes: int
    #: "data" (``Data`` content under the cache prefix) or "context" (a job context zip).
    kind: str = "data"

    def age(self, now: float) -> float | None:
        return None if self.marked_at is None else max(0.0, now - self.marked_at)


def cache_entries(store: ObjectStore) -> list[CacheEntry]:
    """Every cache entry: complete ones (marker) and content left without a marker
    (an interrupted upload, or one in progress)."""
    markers = {
        key.rsplit("/", 1)[1]: mtime
        for key, (_, mtime) in stat_objects(store, MARKER_PREFIX + "/").items()
    }
    sizes: dict[str, list[int]] = {}
    for key, (size, _) in stat_objects(store, CACHE_PREFIX + "/").items():
        digest = key[len(CACHE_PREFIX) + 1 :].split("/", 1)[0]
        files_bytes = sizes.setdefault(digest, [0, 0])
        files_bytes[0] += 1
        files_bytes[1] += size
    # The incremental layout on a bucket: the manifest is written last (no marker);
    # on a local store the marker still is (the entry dir is linked first).
    for digest, manifest, mtime in _manifests(store):
        if store.scheme != "file":
            markers.setdefault(digest, mtime)
        if digest not in sizes and manifest is not None:
            sizes[digest] = [len(manifest.files), manifest.total_bytes]
    entries = [
        CacheEntry(
            content_hash=digest,
            complete=digest in markers,
            marked_at=markers.get(digest),
            files=sizes.get(digest, [0, 0])[0],
            bytes=sizes.get(digest, [0, 0])[1],
        )
        for digest in sorted(set(markers) | set(sizes))
    ]
    # Job contexts (the DAG project's zip) are written as one atomic object, so an
    # object there is complete; its upload time is its age.
    for key, (size, mtime) in sorted(stat_objects(store, CONTEXT_CACHE + "/").items()):
        digest = key.rsplit("/", 1)[1].removesuffix(".zip")
        entries.append(CacheEntry(digest, True, mtime, 1, size, kind="context"))
    return entries


def _manifests(store: ObjectStore) -> list[tuple[str, Manifest | None, float]]:
    """Every tree manifest: (content hash, the manifest or None when unreadable, its
    mtime)."""
    found = []
    for key, (_, mtime) in stat_objects(store, TREES_PREFIX + "/").items():
        if not key.endswith(".json"):
            continue  # an upload's claim
        digest = key[len(TREES_PREFIX) + 1 :].removesuffix(".json")
        try:
            manifest: Manifest | None = Manifest.decode(store.read_bytes(key), key)
        except (ObjectNotFound, ManifestError):
            manifest = None
        found.append((digest, manifest, mtime))
    return found


def named_files(store: ObjectStore) -> set[str] | None:
    """The file objects (SHA-256) every manifest in the store names: their holders.
    None when a manifest cannot be read (then no file object may be deleted)."""
    named: set[str] = set()
    for _, manifest, _ in _manifests(store):
        if manifest is None:
            return None
        named |= manifest.shas()
    return named


def gc_candidates(entries: Iterable[CacheEntry], older_than_s: float, now: float) -> list:
    """Complete entries whose marker is older than ``older_than_s``.  Entries without
    a marker are never collected: one may be an upload in progress."""
    return [e for e in entries if e.complete and (e.age(now) or 0.0) > older_than_s]


def remove_entry(store: ObjectStore, entry: CacheEntry) -> int:
    """Delete one entry, the marker FIRST: a reader that sees a marker must find the
    content, so the content goes only once nothing says it is complete.  Returns the
    number of objects deleted."""
    if entry.kind == "context":
        return int(_delete_object(store, f"{CONTEXT_CACHE}/{entry.content_hash}.zip"))
    marker = f"{MARKER_PREFIX}/{entry.content_hash}"
    deleted = int(_delete_object(store, marker))
    deleted += int(_delete_object(store, tree_key(entry.content_hash)))
    deleted += store.delete_prefix(f"{CACHE_PREFIX}/{entry.content_hash}")
    if store.exists(marker):
        # A submit re-uploaded the entry while we deleted it: drop its marker too, so
        # the next submit uploads again instead of trusting half-deleted content.
        _delete_object(store, marker)
    return deleted


def _delete_object(store: ObjectStore, key: str) -> bool:
    """Delete one object (``delete_prefix`` only removes what is *under* a key);
    whether it was there."""
    if store.scheme == "file":
        try:
            os.remove(file_uri_path(store.uri(key)))
        except FileNotFoundError:
            return False
        return True
    blob = store._bucket().blob(key)  # type: ignore[attr-defined]  # GcsStore only
    try:
        blob.delete()
    except Exception as exc:  # noqa: BLE001 - google's NotFound: already gone
        if type(exc).__name__ != "NotFound":
            raise
        return False
    return True


@dataclass(frozen=True)
class LeftParts:
    """The parts of one big upload that were never composed (a client killed between
    uploading its parts and deleting them): ``PARTS_PREFIX/{token}/NN``."""

    token: str
    files: int
    bytes: int
    written_at: float

    def age(self, now: float) -> float:
        return max(0.0, now - self.written_at)


def left_parts(store: ObjectStore) -> list[LeftParts]:
    """Every group of parts in the store, in one listing (none on a local store)."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for key, meta in stat_objects(store, f"{PARTS_PREFIX}/").items():
        token = key[len(PARTS_PREFIX) + 1 :].split("/", 1)[0]
        groups.setdefault(token, []).append(meta)
    return [
        LeftParts(token, len(m), sum(b for b, _ in m), max(t for _, t in m))
        for token, m in sorted(groups.items())
    ]
