"""``airflow kinetic data ...``: list and trim the content-addressed data cache.

The cache lives in the connection's store (``inventory`` reads it: entries, their
completion markers, cached job context archives); on the local backend the rows also
cover local jobs' requirements venvs, which ``gc`` removes once unused for the given
age and no live job runs in them.
"""

from __future__ import annotations

import time
from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.cli import dataholds, inventory
from airflow_provider_kinetic.cli.cleanup import DAY, retention_days
from airflow_provider_kinetic.cli.common import command, output_format
from airflow_provider_kinetic.cli.output import emit, human_age, human_bytes
from airflow_provider_kinetic.core.backends.local import venv as local_venv
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.data.refs import FILES_PREFIX
from airflow_provider_kinetic.core.jobs.cleanup import FAILED_RETENTION_DAYS
from airflow_provider_kinetic.core.jobs.holds import DATA, Candidate, Ref, decide, held_by_text
from airflow_provider_kinetic.core.keys import gc as keys_gc
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage._keys import PARTS_PREFIX
from airflow_provider_kinetic.core.storage.stat import stat_objects
from airflow_provider_kinetic.hooks.kinetic import KineticHook

#: Parts younger than this may belong to an upload still composing them, whatever
#: ``--older-than`` says (a 2 GiB upload's parts live for minutes at most).
PARTS_MIN_AGE_S = 3600.0


def _cache_row(entry: inventory.CacheEntry, now: float, action: str | None = None) -> dict:
    row: dict[str, Any] = {
        "hash": entry.content_hash,
        "kind": entry.kind,
        "complete": entry.complete,
        "age_s": None if entry.marked_at is None else round(entry.age(now) or 0.0, 1),
        "age": human_age(entry.age(now)) if entry.complete else "incomplete",
        "files": entry.files,
        "bytes": entry.bytes,
        "size": human_bytes(entry.bytes),
    }
    if action:
        row["action"] = action
    return row


def _aged_row(
    digest: str,
    kind: str,
    complete: bool,
    age_s: float,
    files: int,
    nbytes: int,
    action: str | None,
    **extra: Any,
) -> dict:
    """A row for what is collected by age alone (a venv, a killed upload's parts)."""
    row: dict[str, Any] = {
        "hash": digest,
        "kind": kind,
        "complete": complete,
        "age_s": round(age_s, 1),
        "age": human_age(age_s),
        "files": files,
        "bytes": nbytes,
        "size": human_bytes(nbytes),
        **extra,
    }
    if action:
        row["action"] = action
    return row


def _venv_row(entry: local_venv.VenvEntry, now: float, action: str | None = None) -> dict:
    age = entry.age(now)
    return _aged_row(
        entry.digest, "venv", True, age, entry.files, entry.bytes, action, path=entry.path
    )


def _collect_files(store: ObjectStore, age: float, now: float, dry_run: bool) -> list[dict]:
    """The incremental layout's file objects (``default/data-files/{sha256}``): each is
    held by every manifest that names it, so one is deleted only once no manifest left
    names it (after the entries above went) and it is older than ``age`` and an hour
    (an upload in flight writes its files before its manifest)."""
    named = inventory.named_files(store)
    if named is None:  # an unreadable manifest: what it names is unknown
        return []
    rows = []
    for key, (size, mtime) in stat_objects(store, FILES_PREFIX + "/").items():
        sha, old = key.rsplit("/", 1)[-1], max(0.0, now - mtime)
        if sha in named or old <= max(age, PARTS_MIN_AGE_S):
            continue
        if not dry_run:
            store.delete(key)
        rows.append(
            _aged_row(sha, "file", True, old, 1, size, "would delete" if dry_run else "deleted")
        )
    return rows


def _parts_row(parts: inventory.LeftParts, now: float, action: str) -> dict:
    return _aged_row(
        parts.token, "upload parts", False, parts.age(now), parts.files, parts.bytes, action
    )


def _expired_row(state: Any, dry_run: bool) -> dict:
    """A key past its ttl (its content is then collected like any unreferenced entry)."""
    v = state.current
    return {
        "hash": v.version,
        "kind": "key",
        "complete": True,
        "age": "expired",
        "files": v.files,
        "bytes": v.size,
        "size": human_bytes(v.size),
        "key": state.key,
        "action": "would expire" if dry_run else "expired",
    }


def _local_root(hook: KineticHook, store: ObjectStore) -> str | None:
    """The local backend's root, where local jobs' requirements venvs live (None for
    a bucket: cluster jobs have images, not venvs)."""
    config = hook.get_config()
    if not config.root or store.scheme != "file":
        return None
    return LocalBackend.bucket_for(config)  # the root jobs were given, spelled the same


@command
def data_ls(args: Namespace) -> None:
    """Data-cache entries (age of the completion marker, files, bytes), cached job
    context archives and, on the local backend, local jobs' requirements venvs (age of
    their last use)."""
    hook = KineticHook(args.conn_id)
    store = hook.get_store()
    now = time.time()
    rows = [_cache_row(e, now) for e in inventory.cache_entries(store)]
    if root := _local_root(hook, store):
        rows += [_venv_row(e, now) for e in local_venv.list_venvs(root)]
    emit(rows, output_format(args), ("hash", "kind", "age", "files", "size"))


@command
def data_gc(args: Namespace) -> None:
    """Remove keys past their ttl; then complete cache entries (and context archives)
    older than ``--older-than`` that nothing holds (``core.jobs.holds.decide``: no live
    key's kept version, no pin, no job or batch in the history, no XCom; a kept entry
    says what holds it, ``held_by``), and local
    requirements venvs unused for that long that no live job runs in; and the parts of
    big uploads a killed client never composed (older than an hour at least)."""
    age = inventory.parse_age(args.older_than)
    hook = KineticHook(args.conn_id)
    store = hook.get_store()
    now = time.time()
    keys = KeyStore(store)
    rows = [_expired_row(st, args.dry_run) for st in keys_gc.expire(keys, now, args.dry_run)]
    retry_s = retention_days("failed_retention_days", FAILED_RETENTION_DAYS) * DAY
    holds = dataholds.holds(store, getattr(args, "force", False), now, retry_s)
    candidates = inventory.gc_candidates(inventory.cache_entries(store), age, now)
    # Context archives are held by nothing but their age: a job packs them anew.
    decision = decide(
        [Candidate(Ref(DATA, e.content_hash)) for e in candidates if e.kind == "data"], holds
    )
    for entry in candidates:
        held = decision.held_by(Ref(DATA, entry.content_hash)) if entry.kind == "data" else []
        if held:
            row = _cache_row(entry, now, f"kept: {held_by_text(held)}")
            rows.append({**row, "held_by": [str(h) for h in held]})
        elif args.dry_run:
            rows.append(_cache_row(entry, now, "would delete"))
        else:
            inventory.remove_entry(store, entry)
            rows.append(_cache_row(entry, now, "deleted"))
    rows += _collect_files(store, age, now, args.dry_run)
    for parts in inventory.left_parts(store):  # a killed client's uncomposed upload
        if parts.age(now) <= max(age, PARTS_MIN_AGE_S):
            continue  # maybe an upload in progress
        if not args.dry_run:
            store.delete_prefix(f"{PARTS_PREFIX}/{parts.token}")
        rows.append(_parts_row(parts, now, "would delete" if args.dry_run else "deleted"))
    if root := _local_root(hook, store):
        in_use = LocalBackend(root).venvs_in_use()
        for venv in local_venv.list_venvs(root):
            if not local_venv.idle_enough(venv.age(now), age):
                continue
            if venv.path in in_use:
                rows.append(_venv_row(venv, now, "kept: a live job runs in it"))
            elif args.dry_run:
                rows.append(_venv_row(venv, now, "would delete"))
            elif local_venv.collect(venv, age, in_use):
                rows.append(_venv_row(venv, now, "deleted"))
    out = output_format(args)
    if out != "json":  # a table's cell: the holders in a few words
        rows = [{**r, "held_by": held_by_text(r.get("held_by") or ())} for r in rows]
    emit(rows, out, ("hash", "kind", "age", "files", "size", "action", "held_by"))
