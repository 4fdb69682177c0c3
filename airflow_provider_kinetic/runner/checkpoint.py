"""Checkpoint sync: a local directory mirrored to its store slot as whole snapshots.

The function writes files into ``KINETIC_CHECKPOINT_DIR`` (a local path on every
backend); this module makes them outlive the job (layout: ``core/jobs/checkpoint.py``):

- **Restore** (before the function starts): the slot's ``manifest.json`` lists every
  file (its object key, size and SHA-256); each is downloaded into the directory and
  checked against it.  No manifest: an empty directory (a first attempt).
- **Sync** (every ``checkpoint_sync_s``, on SIGTERM, at exit): a scan compares each
  file's ``lstat`` (size, mtime, inode, ctime) with what was last restored or uploaded;
  only files whose stat changed are read, and only those whose SHA-256 changed are
  uploaded, each under a key of its own (``files/{attempt}-{sync}/{path}``), never
  over an object that a manifest names.  The new manifest is written last (one atomic
  object), so a restore sees the snapshot of one sync or of the one before, never half
  of one; a sync cut short (a kill in the grace period) publishes nothing.
- A file written *while* it was uploaded (its stat changed meanwhile) keeps its last
  published version in this snapshot and goes up with the next sync.  Files ending in
  ``.tmp`` are skipped (write ``x.tmp``, then ``os.replace`` it to ``x``: a file is
  then whole whenever a sync reads it); symlinks and empty directories are skipped.
- **Deletions** propagate: a file removed locally is left out of the next manifest and
  its object deleted once that manifest is written (a cut-short sync leaves objects no
  manifest names; the next restore that finds a manifest deletes them).
- Before publishing, a sync checks that no newer attempt has started (its marker under
  ``attempts/``): a job still running after its replacement started (a node that came
  back) stops syncing instead of overwriting the newer attempt's snapshot.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.jobs.checkpoint import (
    ATTEMPTS_DIR,
    FILES_DIR,
    MANIFEST_NAME,
    attempts_in,
)
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger("kinetic.runner")

#: Files with this suffix are being written (by convention): never synced.
SKIP_SUFFIX = ".tmp"
#: Concurrent downloads at restore (each a round trip on GCS).
RESTORE_WORKERS = 16
#: Rescans when files vanish between a scan and their upload (a "keep last N" cleanup).
UPLOAD_TRIES = 3

#: What a file looked like: (size, mtime ns, inode, ctime ns); a change of any = reread.
Sig = tuple[int, int, int, int]


class CheckpointError(Exception):
    """The stored checkpoint cannot be restored as its manifest says."""


@dataclass(frozen=True)
class Entry:
    """One file of a published snapshot (``key`` is relative to the host's prefix)."""

    key: str
    size: int
    sha256: str


def file_sig(path: str) -> Sig | None:
    """The stat signature of a regular file; None for anything else or nothing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def scan(local_dir: str) -> dict[str, Sig]:
    """``{relative path: signature}`` of the regular files under ``local_dir``."""
    out: dict[str, Sig] = {}
    for dirpath, dirs, files in os.walk(local_dir):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SKIP_SUFFIX):
                continue
            path = os.path.join(dirpath, name)
            sig = file_sig(path)
            if sig is not None:
                out[os.path.relpath(path, local_dir).replace(os.sep, "/")] = sig
    return out


def digest(path: str) -> tuple[str, int]:
    """SHA-256 and size of the bytes read (1 MiB reads)."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _local_path(local_dir: str, rel: str) -> str:
    """``local_dir/rel`` for a manifest path, refusing one that would leave the dir."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"the manifest names an unsafe path: {rel!r}")
    return os.path.join(local_dir, *parts)


class CheckpointSync:
    """One host's checkpoint directory and its slot in the store, for one attempt."""

    def __init__(self, store: ObjectStore, prefix: str, local_dir: str, attempt: int) -> None:
        self.store, self.prefix, self.local_dir, self.attempt = store, prefix, local_dir, attempt
        #: The snapshot the store's manifest holds (what a restore would give).
        self.published: dict[str, Entry] = {}
        #: Local file signature -> the entry whose content it had when last read.
        self.known: dict[str, tuple[Sig, Entry]] = {}
        self.syncs = 0
        self.superseded = False
        #: Totals, for the log and for tests: syncs that published, files, bytes.
        self.stats = {"published": 0, "uploaded_files": 0, "uploaded_bytes": 0}
        self._lock = threading.Lock()
        self._owner: int | None = None

    # ---- restore ------------------------------------------------------------------
    def restore(self) -> int:
        """Download the published snapshot into the (new, empty) local dir; returns
        the number of files.  Raises CheckpointError when a file does not match."""
        os.makedirs(self.local_dir, exist_ok=True)
        try:
            raw = self.store.read_bytes(self.prefix + MANIFEST_NAME)
        except ObjectNotFound:
            raw = None
        files = _parse_manifest(raw) if raw is not None else {}

        def fetch(item: tuple[str, Entry]) -> None:
            rel, entry = item
            path = _local_path(self.local_dir, rel)
            try:
                self.store.download_file(self.prefix + entry.key, path)
            except ObjectNotFound as exc:
                raise CheckpointError(
                    f"checkpoint file {rel!r} is missing from the store ({exc}); delete "
                    f"{self.store.uri(self.prefix)} to start the task over"
                ) from exc
            if digest(path) != (entry.sha256, entry.size):
                raise CheckpointError(
                    f"checkpoint file {rel!r} does not match its manifest; delete "
                    f"{self.store.uri(self.prefix)} to start the task over"
                )

        if files:
            with ThreadPoolExecutor(max_workers=min(RESTORE_WORKERS, len(files))) as pool:
                list(pool.map(fetch, files.items()))
        for rel, entry in files.items():
            sig = file_sig(_local_path(self.local_dir, rel))
            if sig is not None:
                self.known[rel] = (sig, entry)
        self.published = files
        if raw is not None:  # no manifest: nothing was published, so rarely anything to collect
            self._collect_orphans()
        return len(files)

    def _collect_orphans(self) -> None:
        """Delete objects under ``files/`` that the manifest does not name (left by a
        sync that was cut short, or deletions an attempt had no time for)."""
        named = {self.prefix + e.key for e in self.published.values()}
        for key in self.store.list(f"{self.prefix}{FILES_DIR}/"):
            if key not in named:
                self.store.delete(key)

    # ---- sync ---------------------------------------------------------------------
    def sync(self, deadline: float | None = None, hurry: bool = False) -> bool:
        """Publish the directory's current snapshot if it changed; whether the store now
        holds it.  ``deadline`` (monotonic): how long to wait for a sync in progress;
        ``hurry`` (the SIGTERM grace): leave deleting replaced objects to the next
        attempt.  A signal handler interrupting this thread's own sync returns False at
        once (that sync will never finish; the last published snapshot stands)."""
        if self._owner == threading.get_ident():
            return False
        wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=wait):
            log.warning("checkpoint sync still running at the deadline: not synced again")
            return False
        self._owner = threading.get_ident()
        try:
            return self._sync(hurry)
        finally:
            self._owner = None
            self._lock.release()

    def _sync(self, hurry: bool) -> bool:
        if self.superseded:
            return False
        current, uploads = self._changes(scan(self.local_dir))
        torn: list[str] = []
        if uploads:
            self.syncs += 1
            gen = f"{FILES_DIR}/{self.attempt}-{self.syncs}"
            uploads = self._upload(gen, uploads)
            for rel, sig, sha, size in uploads:
                path = os.path.join(self.local_dir, *rel.split("/"))
                if file_sig(path) == sig and sig[0] == size:
                    entry = Entry(f"{gen}/{rel}", size, sha)
                    current[rel] = entry
                    self.known[rel] = (sig, entry)
                    self.stats["uploaded_files"] += 1
                    self.stats["uploaded_bytes"] += size
                else:  # written while it was read: its last version stands this time
                    torn.append(f"{self.prefix}{gen}/{rel}")
                    self.known.pop(rel, None)
                    if rel in self.published:
                        current[rel] = self.published[rel]
        if current == self.published:
            self._delete(torn)
            return True
        if self._newer_attempt():
            self.superseded = True
            log.warning("a newer attempt of this task has started: checkpoint sync stops")
            return False
        self.store.write_bytes(self.prefix + MANIFEST_NAME, self._manifest(current))
        named = {e.key for e in current.values()}
        replaced = [self.prefix + e.key for e in self.published.values() if e.key not in named]
        self.published = current
        self.stats["published"] += 1
        if not hurry:
            self._delete(replaced + torn)
        return True

    def _changes(
        self, local: dict[str, Sig]
    ) -> tuple[dict[str, Entry], list[tuple[str, Sig, str, int]]]:
        """(the snapshot's unchanged entries, files to upload as (rel, sig, sha, size)):
        a file whose stat is as last seen is not read; one whose content is as last
        published (touched, rewritten the same) is not uploaded."""
        current: dict[str, Entry] = {}
        uploads: list[tuple[str, Sig, str, int]] = []
        for rel, sig in local.items():
            seen = self.known.get(rel)
            if seen is not None and seen[0] == sig:
                current[rel] = seen[1]
                continue
            try:
                sha, size = digest(os.path.join(self.local_dir, *rel.split("/")))
            except OSError:  # removed or replaced since the scan
                continue
            last = seen[1] if seen is not None else self.published.get(rel)
            if last is not None and (last.sha256, last.size) == (sha, size):
                current[rel] = last
                self.known[rel] = (sig, last)
            else:
                uploads.append((rel, sig, sha, size))
        return current, uploads

    def _upload(
        self, gen: str, uploads: list[tuple[str, Sig, str, int]]
    ) -> list[tuple[str, Sig, str, int]]:
        """Upload the files (the store's parallel upload) under ``gen``; files that
        vanished meanwhile are dropped and the rest sent again.  Returns what was sent."""
        for attempt in range(UPLOAD_TRIES):
            try:
                self.store.upload_files(self.local_dir, [u[0] for u in uploads], self.prefix + gen)
                return uploads
            except FileNotFoundError:
                if attempt == UPLOAD_TRIES - 1:
                    raise
                uploads = [
                    u
                    for u in uploads
                    if os.path.isfile(os.path.join(self.local_dir, *u[0].split("/")))
                ]
        return uploads

    def _newer_attempt(self) -> bool:
        found = attempts_in(self.store.list(f"{self.prefix}{ATTEMPTS_DIR}/"), self.prefix)
        return bool(found) and found[-1] > self.attempt

    def _manifest(self, files: dict[str, Entry]) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "attempt": self.attempt,
                "sync": self.syncs,
                "written_at": time.time(),
                "files": {
                    rel: {"key": e.key, "size": e.size, "sha256": e.sha256}
                    for rel, e in sorted(files.items())
                },
            },
            indent=1,
        ).encode()

    def _delete(self, keys: list[str]) -> None:
        """Delete objects no manifest names any more (failures only logged: the next
        attempt's restore collects what is left)."""
        for key in keys:
            try:
                self.store.delete(key)
            except Exception as exc:  # noqa: BLE001 - published already; tidy up later
                log.info("could not delete replaced checkpoint object %s: %s", key, exc)


def _parse_manifest(raw: bytes) -> dict[str, Entry]:
    try:
        value: Any = json.loads(raw)
        return {
            str(rel): Entry(str(e["key"]), int(e["size"]), str(e["sha256"]))
            for rel, e in value["files"].items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"the checkpoint manifest cannot be read: {exc}") from exc
