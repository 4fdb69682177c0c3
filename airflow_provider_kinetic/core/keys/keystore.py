"""``KeyStore``: named, versioned data on any ObjectStore (put, ls, rm; get is
``fetch.py``).

A key is a pointer to content hashes.  The content itself is the data cache that
``Data`` already fills (``default/data-cache/{hash}`` + its marker): ``put`` hashes
``src`` exactly as a ``Data`` does (the stat cache makes an unchanged tree one
``lstat`` per file) and ``upload_data`` uploads it only when the cache lacks it.
Then the key's state object moves by compare-and-swap (``storage/swap.py``): a
writer that loses the race re-reads and re-applies its version on top, so two
concurrent puts both land in the history and the pointer names one of them.

Blobs are never deleted here: several keys, jobs and XComs may share one hash.
``data gc`` collects what nothing references (``keys/gc.py`` says what keys hold).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.data.cache import upload_data
from airflow_provider_kinetic.core.data.refs import KINETIC_LAYOUT, marker_key
from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.durations import duration_s
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.keys.names import (
    KEYS_PREFIX,
    KeyNameError,
    KeyNotFound,
    check_key,
    check_prefix,
    key_of_pointer,
    nearest,
    parse_ref,
    pointer_key,
)
from airflow_provider_kinetic.core.keys.records import (
    DEFAULT_KEEP,
    LOGICAL_DATE,
    KeyState,
    Version,
    cut,
    iso,
    older_than_current,
)
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore, PreconditionFailed
from airflow_provider_kinetic.core.storage.swap import ABSENT, read_versioned, swap

log = logging.getLogger(__name__)

#: Swap attempts before giving up (each loss means another writer made progress).
MAX_SWAPS = 200
#: Where task instances' pin records live (``pins.py``): they hold the versions they name.
PINS_PREFIX = "_airflow/keypins"
TTL_FORM = "a duration such as '45s', '30m', '12h' or '7d' (or seconds as a number)"


class KeyConflict(KineticError, RuntimeError):
    """The pointer kept moving under us for ``MAX_SWAPS`` tries."""


def parse_ttl(ttl: object) -> float | None:
    """``ttl=`` in seconds (None: keep the key's current ttl)."""
    if ttl is None:
        return None
    seconds = float(ttl) if isinstance(ttl, int | float) else duration_s(ttl)
    if seconds is None or seconds <= 0:
        raise KeyNameError(f"ttl {ttl!r} is not valid: {TTL_FORM}, greater than 0")
    return seconds


def key_layout(store: ObjectStore) -> str | None:
    """Keys' versions are per-tree cache entries (read by prefix: fetch, peers,
    broadcast); a local store has one in either layout, a bucket only in kinetic's."""
    return None if store.scheme == "file" else KINETIC_LAYOUT


class KeyStore:
    """Keys in ``store``.  ``who`` says who is putting (Airflow task, job or user);
    ``keep`` is the history length for keys this store writes (None: the key's own,
    else ``DEFAULT_KEEP``)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        who: Callable[[], dict[str, Any]] | None = None,
        keep: int | None = None,
    ) -> None:
        self.store = store
        self.who = who or (lambda: {})
        self.keep = keep

    # ---- reading ------------------------------------------------------------------
    def state(self, key: str) -> KeyState | None:
        data, _ = read_versioned(self.store, pointer_key(check_key(key)))
        return None if data is None else KeyState.from_bytes(data)

    def names(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix`` (sorted)."""
        found = (key_of_pointer(o) for o in self.store.list(f"{KEYS_PREFIX}/{prefix}"))
        return sorted(k for k in found if k is not None)

    def states(self, prefix: str = "") -> list[KeyState]:
        out = []
        for key in self.names(check_prefix(prefix)):
            state = self.state(key)
            if state is not None and state.versions:
                out.append(state)
        return out

    def ls(self, prefix: str = "") -> list[dict[str, Any]]:
        """One row per key: its current version, size, files, time, who, how many
        versions are kept, and when it expires."""
        rows = []
        for st in self.states(prefix):
            row = st.current.row(st.key)
            row["versions"] = len(st.versions)
            row["expires"] = None if st.expires_at is None else iso(st.expires_at)
            rows.append(row)
        return rows

    def resolve(self, ref: str, version: str | None = None) -> tuple[KeyState, Version]:
        """The state and the version ``ref`` (``key`` or ``key@version``) names;
        ``KeyNotFound`` listing the nearest keys or the kept versions."""
        key, version = parse_ref(ref, version)
        state = self.state(key)
        if state is None or not state.versions:
            raise KeyNotFound(f"no key {key!r} in {self.store.uri()}; {nearest(key, self.names())}")
        if state.expired():
            raise KeyNotFound(f"key {key!r} expired at {_when(state.expires_at)} (ttl)")
        if version is None:
            return state, state.current
        hits = state.find(version)
        if len(hits) != 1:
            kept = ", ".join(v.version[:12] for v in state.versions)
            what = "matches several versions" if hits else "is not a kept version"
            raise KeyNotFound(f"{version!r} {what} of key {key!r}; kept: {kept}")
        return state, hits[0]

    def pinned_versions(self, key: str) -> frozenset[str]:
        """Versions of ``key`` some task instance's pin record names (``pins.py``): a
        retry or clear of that task reads them, so no put cuts them from the record."""
        held = set()
        for name in self.store.list(f"{PINS_PREFIX}/"):
            if not name.endswith(".json"):
                continue
            try:
                body = json.loads(self.store.read_bytes(name))
            except (ObjectNotFound, ValueError):
                continue
            pins = body.get("pins") if isinstance(body, dict) else None
            if isinstance(pins, dict) and isinstance(pins.get(key), str):
                held.add(pins[key])
        return frozenset(held)

    # ---- writing ------------------------------------------------------------------
    def put(
        self,
        key: str,
        src: str | os.PathLike[str],
        *,
        ttl: object = None,
        forward_only: bool = False,
    ) -> dict[str, Any]:
        """Hash ``src`` (a file or directory) as ``Data`` does, upload what the data
        cache lacks, and make it the key's current version.

        ``forward_only``: a version whose ``by["logical_date"]`` is earlier than the
        current version's is kept aside instead (stored and listed, the key not
        moved; decided inside the compare-and-swap, so two runs finishing together
        cannot both win); the row then says ``aside`` with the reason."""
        check_key(key)
        ttl_s = parse_ttl(ttl)
        path = os.fspath(src)
        if not os.path.lexists(path):
            raise KeyNameError(f"put src {path!r} does not exist: give a file or a directory")
        data = Data(os.path.abspath(path))
        digest = data.content_hash()  # refuses FIFOs, sockets, devices, naming them
        uploaded = upload_data(self.store, data, key_layout(self.store))
        root, files = data.hashed_files()
        is_dir = data.is_dir
        record = Version(
            version=digest,
            epoch=time.time(),
            size=sum(size for _, size in files),
            files=len(files),
            kind="dir" if is_dir else "file",
            name="" if is_dir else os.path.basename(data.local_path),
            empty_dirs=data.empty_dirs(),
            by=self.who(),
            put_id=secrets.token_hex(8),
        )
        aside: list[str] = []

        def change(state: KeyState) -> KeyState:
            aside.clear()
            keep = max(1, self.keep or state.keep)
            over = len({v.version for v in state.versions} | {record.version}) > keep
            held = self.pinned_versions(key) if over else frozenset()  # only when cutting
            if forward_only and older_than_current(state, record):
                aside.append(
                    f"its logical date {record.by.get(LOGICAL_DATE)} is before the current "
                    f"version's ({state.current.by.get(LOGICAL_DATE)}, "
                    f"{state.current.version[:12]})"
                )
                return _with_options(state.kept_aside(record, held), self.keep, ttl_s, held)
            return _with_options(state.pushed(record, held), self.keep, ttl_s, held)

        self._update(key, change, record)
        if not self.store.exists(marker_key(digest)):  # gc raced us: make it whole again
            log.warning("key %s: content %s was collected meanwhile; uploading again", key, digest)
            upload_data(self.store, Data(os.path.abspath(path)), key_layout(self.store))
        row = record.row(key)
        row["uploaded"] = uploaded
        if aside:
            row["aside"] = aside[0]
        log.info(
            "put %s -> %s (%d files, %d bytes, %s)",
            key,
            digest[:12],
            record.files,
            record.size,
            "uploaded" if uploaded else "nothing to upload",
        )
        return row

    def renew(self, key: str, version: str) -> bool:
        """A publish of content ``key`` already holds as ``version``: no new version,
        but the key's ttl counts from now (``KeyState.renewed``), so a task whose
        output is the same each run keeps its key alive.  False when the key no
        longer keeps that version (nothing renewed)."""
        renewed = [False]

        def change(state: KeyState) -> KeyState:
            renewed[0] = any(v.version == version for v in state.versions)
            if renewed[0]:
                state.renewed = max(time.time(), state.renewed or 0.0)
            return state

        self._update(check_key(key), change, None)
        return renewed[0]

    def rm(
        self,
        ref: str,
        version: str | None = None,
        *,
        recursive: bool = False,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """Remove a version (``version=`` or ``key@version``), a key (all its kept
        versions), or with ``recursive`` every key under a prefix.  Returns what was
        (or, with ``dry_run``, would be) removed, one row per version."""
        key, version = parse_ref(ref, version)
        if version is not None:
            _, target = self.resolve(key, version)
            if not dry_run:
                self._update(key, lambda st: _without(st, target.version), None)
            return [target.row(key)]
        keys = [k for k in self.names(key) if k == key or k.startswith(key + "/")]
        if not recursive:
            keys = [k for k in keys if k == key]
        if not keys:
            hint = " (a prefix needs recursive=True)" if self.names(key + "/") else ""
            raise KeyNotFound(f"no key {key!r}{hint}; {nearest(key, self.names())}")
        removed = []
        for k in keys:
            state = self.state(k)
            removed += [v.row(k) for v in (state.versions if state else [])]
            if not dry_run:
                self._update(k, lambda st: None, None)
        return removed

    def _update(
        self,
        key: str,
        change: Callable[[KeyState], KeyState | None],
        mine: Version | None,
    ) -> None:
        """Read, change, compare-and-swap; on a lost race read again and re-apply."""
        obj = pointer_key(key)
        for _ in range(MAX_SWAPS):
            data, token = read_versioned(self.store, obj)
            state = KeyState(key, keep=self.keep or DEFAULT_KEEP) if data is None else None
            state = state or KeyState.from_bytes(data or b"")
            if mine is not None and any(v.put_id == mine.put_id for v in state.versions):
                return  # a retried write of ours had landed
            new = change(state)
            if new is not None and not new.versions:
                new = None
            if new is None and token == ABSENT:
                return
            try:
                swap(self.store, obj, None if new is None else new.to_bytes(), token)
                return
            except PreconditionFailed:
                continue
        raise KeyConflict(f"key {key!r}: its pointer kept moving ({MAX_SWAPS} tries); retry")


def _with_options(
    state: KeyState, keep: int | None, ttl_s: float | None, held: frozenset[str] = frozenset()
) -> KeyState:
    if keep is not None:
        state.keep = max(1, keep)
        state.versions = cut(state.versions, state.keep, held)
    if ttl_s is not None:
        state.ttl_s = ttl_s
    return state


def _without(state: KeyState, version: str) -> KeyState:
    state.versions = [v for v in state.versions if v.version != version]
    return state


def _when(epoch: float | None) -> str:
    return "never" if epoch is None else iso(epoch)
