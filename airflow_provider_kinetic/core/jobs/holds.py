"""What is still needed: one reference graph over the store, and the one function every
deletion path asks (docs/OPERATIONS.md lists every kind of object and its holders).

An object of the store is a :class:`Ref` (its kind and name: a data-cache entry by
hash, a job's ``{job_id}/`` artifacts, a key's version, a task run's checkpoints).  A
:class:`Holder` is something that still needs it, named for people ("running job
job-1234", "batch job-abcd input 3 (retryable)", "key models/churn version 5e1f...
(kept)", "pin dag/run/task", "XCom kinetic_job of dag / run / task", "history entry
of job-5678").  :func:`store_holds` reads every holder the store knows of (history
entries, batch entries, key records, pin records); the Airflow side adds the XComs
(``cli/xcomrefs.py``, ``cli/dataholds.py``).  Every deletion path (``jobs cleanup`` in
its three forms, ``data gc``, key expiry, checkpoint staleness) hands its candidates to
:func:`decide`, which says what may go and what holds the rest; ``--dry-run`` prints
those holders (``held_by``).

Nothing here deletes: the callers do, so each keeps its own way to delete (a
compare-and-swap for a key pointer, the backend's cleanup for a job).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.jobs import history, resultcache
from airflow_provider_kinetic.core.jobs.checkpoint import task_checkpoints_key
from airflow_provider_kinetic.core.jobs.history import DATA_HASHES
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.pins import pinned
from airflow_provider_kinetic.core.storage import ObjectStore

#: Kinds of :class:`Ref`.
DATA = "data"  # a data-cache entry, by content hash
ARTIFACTS = "artifacts"  # a job's ``{job_id}/`` dir
BATCH = "batch"  # a batch (group id): what holds it holds its children's artifacts
KEY_VERSION = "key-version"  # ``key@version`` in a key's record
CHECKPOINTS = "checkpoints"  # a task run's ``checkpoints/tasks/...`` prefix
OUTPUT = "output"  # an output dir, by its URI as XCom ``output_dir`` spells it

#: The history entry fields a batch writes at its end (``core/batch/finish.py``):
#: ``{job_id: input index}`` of its children that succeeded, delivered or not.
SUCCEEDED_CHILDREN = "succeeded_children"


@dataclass(frozen=True)
class Ref:
    """One object (or prefix) of the store that a deletion path may delete."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Holder:
    """Something that still needs an object.  ``kind`` is one of ``running job``,
    ``running batch``, ``batch input``, ``key version``, ``pin``, ``xcom``,
    ``history entry``, ``key``, ``cache entry``; ``what`` says it for people."""

    kind: str
    what: str

    def __str__(self) -> str:
        return self.what


@dataclass(frozen=True)
class Candidate:
    """An object a deletion path would delete; ``within``: objects it belongs to (a
    batch child's batch), whose holders hold it too."""

    ref: Ref
    within: tuple[Ref, ...] = ()


@dataclass
class Holds:
    """The reference graph: each held object -> its holders, in the order found."""

    by_ref: dict[Ref, list[Holder]] = field(default_factory=dict)

    def add(self, ref: Ref, holder: Holder) -> None:
        holders = self.by_ref.setdefault(ref, [])
        if holder not in holders:
            holders.append(holder)

    def merge(self, other: Holds) -> Holds:
        for ref, holders in other.by_ref.items():
            for holder in holders:
                self.add(ref, holder)
        return self

    def of(self, ref: Ref) -> list[Holder]:
        return list(self.by_ref.get(ref, ()))


@dataclass
class Decision:
    """What :func:`decide` says of some candidates: those that may go, and each kept
    one with what holds it."""

    go: list[Candidate] = field(default_factory=list)
    kept: dict[Ref, list[Holder]] = field(default_factory=dict)

    def held_by(self, ref: Ref) -> list[Holder]:
        return self.kept.get(ref, [])


def decide(candidates: Iterable[Candidate], holds: Holds) -> Decision:
    """The one question every deletion path asks: of ``candidates``, what may go, and
    what holds the rest (an object is held by its own holders and by those of every
    object it is ``within``)."""
    out = Decision()
    for candidate in candidates:
        holders: list[Holder] = []
        for ref in (candidate.ref, *candidate.within):
            holders += [h for h in holds.of(ref) if h not in holders]
        if holders:
            out.kept[candidate.ref] = holders
        else:
            out.go.append(candidate)
    return out


def held_by_text(holders: Iterable[Holder]) -> str:
    """Holders as one cell of a table (JSON output keeps the list)."""
    return "; ".join(map(str, holders))


# ---- what the store holds -----------------------------------------------------------


def _ended(entry: Mapping[str, Any]) -> bool:
    return entry.get("state") in history.ENDED


def _running(entry: Mapping[str, Any], now: float, stale_s: float) -> bool:
    """Not ended, and changed within ``stale_s``: an entry nobody updated for that long
    is of a driver that died (its job is asked, not assumed, by ``jobs cleanup``)."""
    updated = history.iso_epoch(entry.get("updated_at") or entry.get("submitted_at"))
    return not _ended(entry) and (updated is None or now - updated < stale_s)


def _age_s(entry: Mapping[str, Any], now: float) -> float | None:
    ended = history.iso_epoch(entry.get("ended_at"))
    return None if ended is None else now - ended


def history_holds(entries: Iterable[Mapping[str, Any]], now: float, retry_window_s: float) -> Holds:
    """What jobs and batches in the history hold.

    - A running job holds its artifacts, its data and its task run's checkpoints; a
      running batch holds its children (``Ref(BATCH, group)``), its data and its
      checkpoints.  Running: not ended, and its entry changed less than
      ``retry_window_s`` ago (a driver that died leaves an entry that never ends).
    - Every entry holds the data it reads (``data_hashes``: a retry or a clear of the
      job or batch reads it again) while the entry is in the history.
    - A batch that failed as a whole (nobody has its values) less than
      ``retry_window_s`` ago (``[kinetic] failed_retention_days``) holds its succeeded
      children's artifacts: a retry or a clear of its task resumes it and collects
      them instead of running them again.
    """
    holds = Holds()
    for entry in entries:
        job_id = str(entry.get("job_id"))
        batch = entry.get("kind") == "batch"
        if _running(entry, now, retry_window_s):
            holder = Holder(
                "running batch" if batch else "running job",
                f"running {'batch' if batch else 'job'} {job_id}",
            )
            holds.add(Ref(BATCH if batch else ARTIFACTS, job_id), holder)
            for h in entry.get(DATA_HASHES) or ():
                holds.add(Ref(DATA, str(h)), holder)
            identity = {k: entry.get(k) for k in ("dag_id", "run_id", "task_id", "map_index")}
            if all(identity.get(k) not in (None, "") for k in ("dag_id", "run_id", "task_id")):
                holds.add(Ref(CHECKPOINTS, task_checkpoints_key(identity)), holder)
        for h in entry.get(DATA_HASHES) or ():
            holds.add(Ref(DATA, str(h)), Holder("history entry", f"history entry of {job_id}"))
        age = _age_s(entry, now)
        if batch and entry.get("state") == "FAILED" and age is not None and age < retry_window_s:
            for child, index in (entry.get(SUCCEEDED_CHILDREN) or {}).items():
                what = f"batch {job_id} input {index} (retryable)"
                holds.add(Ref(ARTIFACTS, str(child)), Holder("batch input", what))
    return holds


def key_holds(keys: KeyStore, now: float) -> Holds:
    """What keys and pins hold: every kept version of a live key holds its content;
    every pin record holds the version it names (and so its content), whatever
    ``store_keep_versions`` cut from the key's record."""
    holds = Holds()
    for state in keys.states():
        if state.expired(now):
            continue
        for v in state.versions:
            what = f"key {state.key} version {v.version[:12]} (kept)"
            holds.add(Ref(DATA, v.version), Holder("key", what))
    for (key, version), who in pinned(keys.store).items():
        for ident in who:
            name = "/".join(str(ident.get(k)) for k in ("dag_id", "run_id", "task_id"))
            if ident.get("map_index") not in (None, -1, "-1"):
                name += f"[{ident['map_index']}]"
            holder = Holder("pin", f"pin {name}")
            holds.add(Ref(KEY_VERSION, f"{key}@{version}"), holder)
            holds.add(Ref(DATA, version), holder)
    return holds


def cache_holds(found: Iterable[resultcache.CacheEntry], now: float, retention_s: float) -> Holds:
    """What cache entries hold (``core.jobs.resultcache``): an entry within its
    retention (``[kinetic] cache_retention_days`` from when it was written) holds its
    job's artifacts (the result it reuses) and the output dir it names."""
    holds = Holds()
    for entry in resultcache.held_keys(found, now, retention_s):
        what = f"cache entry {entry.key[:12]} (until {entry.expires_at(retention_s)})"
        holder = Holder("cache entry", what)
        holds.add(Ref(ARTIFACTS, entry.job_id), holder)
        if entry.output_dir:
            holds.add(Ref(OUTPUT, entry.output_dir), holder)
    return holds


def store_holds(
    store: ObjectStore,
    now: float,
    retry_window_s: float,
    entries: list[dict[str, Any]] | None = None,
    cache_retention_s: float = resultcache.CACHE_RETENTION_DAYS * 86400.0,
) -> Holds:
    """Every holder the store itself knows of (history, batches, keys, pins, cache
    entries); the Airflow side merges the XComs' into it."""
    found = history.entries(store) if entries is None else entries
    holds = history_holds(found, now, retry_window_s).merge(key_holds(KeyStore(store), now))
    return holds.merge(cache_holds(resultcache.entries(store), now, cache_retention_s))
