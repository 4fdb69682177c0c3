"""Reuse of identical work: a delivered result kept under its work's reuse key.

With ``cache=True`` a task whose work (``core.jobs.work``: code, arguments, Data
contents, options) equals that of a job that succeeded and delivered its value takes
that value and output dir instead of launching a job.  The key is
``core.jobs.work.reuse_key``: the one work digest, of the call with the arguments
named in ``cache_ignore`` and the task run's own default output dir left out, and the
user's ``cache_version``; never a second notion of sameness.

The store holds, under ``_cache/results/``:

- ``{key}.json``: the entry (:class:`CacheEntry`): the job that produced the result,
  its handle (the result is its ``{job_id}/result.pkl``, verified like any result),
  its output dir, and the task run that produced it.  Written only after the job
  succeeded and its value was delivered: a failed or cancelled job is never cached.
  The entry holds the job's artifacts in the liveness model (``core.jobs.holds``) for
  ``[kinetic] cache_retention_days`` from when it was written; ``jobs cleanup``
  deletes it, and the artifacts, after that.
- ``{key}.claim``: made create-if-absent by the first of concurrent identical tasks
  (the one that runs the job); the others wait for its entry (:func:`wait_for`) and
  run their own job when its job ended without one, its claim went, or the wait's
  deadline passed.  A claim whose job ended (its history says so) or that names no
  job after :data:`CLAIM_GRACE_S` is stale: the next task takes it over.

Nothing here imports Airflow; the operators read the options and do the XComs.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import read_record
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore, PreconditionFailed

log = logging.getLogger(__name__)

CACHE_PREFIX = "_cache/results"
#: Default of ``[kinetic] cache_retention_days``.
CACHE_RETENTION_DAYS = 30.0
#: Default of ``[kinetic] cache_wait_s``: the longest a task waits for a concurrent
#: identical task's result before it runs its own job.
CACHE_WAIT_S = 6 * 3600.0
#: A claim that names no job this long after it was made is of a task that died.
CLAIM_GRACE_S = 600.0
#: How often a waiting task asks the backend whether the claim's job still runs.
BACKEND_CHECK_S = 30.0
#: The history entry ``kind`` of a cache hit (a task that took a result, no job).
HIT_KIND = "cache"
#: The handle ``extra`` field that carries a job's reuse key to whoever finishes it
#: (a resumed deferral, a later try).
CACHE_KEY_FIELD = "cache_key"


@dataclass(frozen=True)
class CacheSettings:
    """A task's ``cache_version`` and ``cache_ignore`` (``cache=True``); checked by
    :func:`settings`.  ``default_output``: the output dir is the task run's own
    default (``outputs/{dag}/{run}/{task}/{map}``), left out of the key, so another run
    reuses the result; a dir the user names stays in it."""

    version: str = ""
    ignore: tuple[str, ...] = ()
    default_output: bool = True


def settings(
    cache: Any, version: Any, ignore: Any, func: Callable[..., Any] | None, task: str
) -> CacheSettings | None:
    """The task's cache settings (None: ``cache=False``), checked at DAG parse time: a
    bad value raises naming itself and what is allowed."""
    if not isinstance(cache, bool):
        raise TypeError(f"task {task!r}: cache={cache!r}: allowed values are True and False")
    if not cache:
        if version is not None or ignore:
            raise ValueError(
                f"task {task!r}: cache_version and cache_ignore take effect only with "
                "cache=True (it is off)"
            )
        return None
    if version is None:
        version = ""
    if not isinstance(version, str):
        raise TypeError(
            f"task {task!r}: cache_version={version!r} ({type(version).__name__}): "
            "must be a string, e.g. cache_version='2'"
        )
    if ignore is None:
        ignore = ()
    if isinstance(ignore, str) or not isinstance(ignore, list | tuple):
        raise TypeError(
            f"task {task!r}: cache_ignore={ignore!r}: must be a list of the function's "
            "argument names, e.g. cache_ignore=['seed']"
        )
    names = _parameters(func)
    for name in ignore:
        if not isinstance(name, str):
            raise TypeError(f"task {task!r}: cache_ignore entry {name!r} is not a string")
        if names is not None and name not in names:
            allowed = ", ".join(map(repr, names)) or "none"
            raise ValueError(
                f"task {task!r}: cache_ignore names {name!r}, which the function does not "
                f"take; its arguments: {allowed}"
            )
    return CacheSettings(version=version, ignore=tuple(ignore))


def _parameters(func: Callable[..., Any] | None) -> list[str] | None:
    """The names ``func`` takes (None: any name, through ``**kwargs``, or unknown)."""
    if func is None:
        return None
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is not p.VAR_POSITIONAL]


def entry_key(key: str) -> str:
    return f"{CACHE_PREFIX}/{key}.json"


def claim_key(key: str) -> str:
    return f"{CACHE_PREFIX}/{key}.claim"


@dataclass
class CacheEntry:
    """One reusable result: the job that produced it and the task run it was for."""

    key: str
    job_id: str
    #: The job's handle as a dict (its result key, its output dir).
    handle: dict[str, Any]
    output_dir: str | None
    created_at: str
    cache_version: str = ""
    func: str = ""
    producer: dict[str, Any] = field(default_factory=dict)

    def made_epoch(self) -> float:
        return history.iso_epoch(self.created_at) or 0.0

    def expired(self, now: float, retention_s: float) -> bool:
        return now - self.made_epoch() >= retention_s

    def expires_at(self, retention_s: float) -> str:
        return history.now_iso(self.made_epoch() + retention_s)

    def describe(self) -> str:
        who = "/".join(str(self.producer.get(k)) for k in ("dag_id", "run_id", "task_id"))
        mi = self.producer.get("map_index")
        if mi not in (None, -1, "-1"):
            who += f"[{mi}]"
        return f"job {self.job_id} of {who}"


def record(store: ObjectStore, entry: CacheEntry) -> None:
    """Write (or replace) the entry of a result just delivered."""
    data = json.dumps(asdict(entry), indent=1, sort_keys=True, default=str).encode()
    store.write_bytes(entry_key(entry.key), data, content_type="application/json")


def read(store: ObjectStore, key: str) -> CacheEntry | None:
    """The entry of ``key`` (None: none, or unreadable)."""
    try:
        doc = json.loads(store.read_bytes(entry_key(key)))
        return CacheEntry(**doc)
    except ObjectNotFound:
        return None
    except (ValueError, TypeError) as exc:
        log.warning("skipping cache entry %s: %s", store.uri(entry_key(key)), exc)
        return None


def usable(store: ObjectStore, entry: CacheEntry, secret: bytes | None = None) -> bool:
    """Whether the result the entry names is still in the store and (with the
    deployment's ``secret``) its output dir still holds that job's files: a later new
    job of the producing task run (a clear that ran other work) starts the run's
    default dir empty (``core.jobs.outputs``), so its record names another job (or
    batch) and the entry is no longer whole."""
    if not store.exists(artifact_key(entry.job_id, "result.pkl")):
        return False
    return secret is None or _dir_kept(store, entry, secret)


def _dir_kept(store: ObjectStore, entry: CacheEntry, secret: bytes) -> bool:
    ids = {k: entry.producer.get(k) for k in ("dag_id", "run_id", "task_id", "map_index")}
    if any(ids.get(k) in (None, "") for k in ("dag_id", "run_id", "task_id")):
        return True
    try:
        record = read_record(store, ids, secret)
    except Exception:  # noqa: BLE001 - cannot tell: the result itself is verified on use
        return True
    if record is None:
        return True
    if record.kind == "batch":
        return record.group_id == entry.handle.get("group_id")
    job = record.job
    return job is None or job.job_id == entry.job_id


def entries(store: ObjectStore) -> list[CacheEntry]:
    """Every readable entry, newest first."""
    found = []
    for name in store.list(CACHE_PREFIX + "/"):
        if name.endswith(".json"):
            entry = read(store, name.rsplit("/", 1)[-1][: -len(".json")])
            if entry is not None:
                found.append(entry)
    found.sort(key=lambda e: (e.created_at, e.key), reverse=True)
    return found


def remove(store: ObjectStore, key: str) -> bool:
    """Drop an entry (its job's artifacts are ``jobs cleanup``'s)."""
    return store.delete(entry_key(key))


# ---- concurrent identical tasks ---------------------------------------------------


@dataclass
class Claim:
    """Who runs the job of a key while others wait: the task run, and its job once
    submitted."""

    owner: dict[str, Any]
    made_at: float
    job_id: str | None = None


def claim(store: ObjectStore, key: str, owner: dict[str, Any], now: float | None = None) -> bool:
    """Take the key's claim (create-if-absent); False: another task holds it."""
    doc = {"owner": owner, "made_at": time.time() if now is None else now, "job_id": None}
    try:
        store.write_bytes(claim_key(key), json.dumps(doc).encode(), if_absent=True)
    except PreconditionFailed:
        return False
    return True


def claim_job(store: ObjectStore, key: str, owner: dict[str, Any], job_id: str) -> None:
    """Name the job the claim's owner submitted (waiters follow its history)."""
    held = read_claim(store, key)
    if held is None or held.owner != owner:
        return
    doc = {"owner": owner, "made_at": held.made_at, "job_id": job_id}
    store.write_bytes(claim_key(key), json.dumps(doc).encode())


def read_claim(store: ObjectStore, key: str) -> Claim | None:
    try:
        doc = json.loads(store.read_bytes(claim_key(key)))
        return Claim(doc.get("owner") or {}, float(doc.get("made_at") or 0), doc.get("job_id"))
    except ObjectNotFound:
        return None
    except (ValueError, TypeError):
        return Claim({}, 0.0)  # unreadable: stale


def release(store: ObjectStore, key: str, owner: dict[str, Any] | None = None) -> None:
    """Drop the key's claim (``owner``: only when it is still that owner's)."""
    held = read_claim(store, key)
    if held is not None and (owner is None or held.owner == owner):
        store.delete(claim_key(key))


def stale(store: ObjectStore, held: Claim, now: float) -> str | None:
    """Why the claim's owner will never write an entry (None: it may still)."""
    if held.job_id is None:
        if now - held.made_at >= CLAIM_GRACE_S:
            return f"its task submitted no job within {CLAIM_GRACE_S:.0f} s"
        return None
    entry = history.read(store, held.job_id) or {}
    if entry.get("state") in history.ENDED and entry.get("state") != "SUCCEEDED":
        return f"its job {held.job_id} ended {entry.get('state')}"
    return None


@dataclass
class Waited:
    """What waiting for a concurrent identical task gave: its entry, or why none."""

    entry: CacheEntry | None
    why: str


def wait_for(
    store: ObjectStore,
    key: str,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    job_ended: Callable[[str], bool] | None = None,
) -> Waited:
    """Wait for the entry of ``key`` while another task's claim lives: the entry, or
    None with why (the claim went without an entry, its job failed, the deadline).
    ``job_ended(job_id)``: whether the backend says the claim's job ended, asked at most
    every :data:`BACKEND_CHECK_S`: a job whose task died ends with nobody to collect
    it (its history still says it runs); ended at two asks in a row (a live task
    collects within that), the claim is stale."""
    deadline = clock() + timeout_s
    asked, ended_before = clock(), None
    while True:
        entry = read(store, key)
        if entry is not None and usable(store, entry):
            return Waited(entry, "written by the task that ran it")
        held = read_claim(store, key)
        if held is None:
            return Waited(None, "the task that ran it ended without a result")
        why = stale(store, held, clock())
        if why is not None:
            return Waited(None, why)
        if job_ended is not None and held.job_id and clock() - asked >= BACKEND_CHECK_S:
            asked = clock()
            ended_now = held.job_id if job_ended(held.job_id) else None
            if ended_now is not None and ended_now == ended_before:
                return Waited(None, f"its job {ended_now} ended and no task collected it")
            ended_before = ended_now
        if clock() >= deadline:
            return Waited(None, f"no result within {timeout_s:.0f} s ([kinetic] cache_wait_s)")
        sleep(poll_s)


def held_keys(found: Iterable[CacheEntry], now: float, retention_s: float) -> list[CacheEntry]:
    """The entries within their retention (they hold their jobs' artifacts)."""
    return [e for e in found if not e.expired(now, retention_s)]
