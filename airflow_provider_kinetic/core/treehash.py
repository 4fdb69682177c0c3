"""kinetic 0.0.4's content hash, computed in one pass, reading only what changed.

The hash (unchanged from kinetic, so data caches are shared): each file's digest is
``sha256(relpath + b"\\0" + bytes)``; a directory's hash is ``sha256(b"dir:" + d1 +
d2 ...)`` in kinetic's walk order (``core/treewalk.py``); a single file's is
``sha256(b"file:" + digest)`` with its basename as relpath.

One pass over the tree: each directory is listed and its entries ``lstat``-ed once;
with a :class:`~airflow_provider_kinetic.core.statcache.StatCache`, a directory whose
names and stat facts all equal the record's reuses its digests without opening a
file, and in a changed directory only the files whose facts changed are read.  Small
files are read (relative to the open directory) and hashed right away, in this
thread: per-file Python work dominates them and threads would only fight over the
GIL.  Files of ``THREAD_FILE`` bytes or more go to a thread pool meanwhile (reading
and hashing release the GIL), so a tree of big files uses every core.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from stat import S_ISDIR, S_ISREG

from airflow_provider_kinetic.core.statcache import (
    NEVER,
    DirRecord,
    DirView,
    Sig,
    StatCache,
    TreeRecord,
    fingerprint,
)
from airflow_provider_kinetic.core.treewalk import (
    DataPathError,
    DirScan,
    Facts,
    FreshDir,
    _special,
    _unreadable,
    dir_facts,
    file_digest,
    fresh_dir,
    open_dir,
    relpath_bytes,
    stat_dir,
)

log = logging.getLogger(__name__)

#: Files this big are hashed on a thread pool (hashing dominates their Python work).
THREAD_FILE = 256 << 10
HASH_THREADS = min(8, (os.cpu_count() or 1) + 1)

__all__ = ["DataPathError", "TreeHash", "content_hash"]


@dataclass
class TreeHash:
    """A content hash and the files it covers (what an upload of it must send)."""

    hexdigest: str
    root: str  # the directory the relpaths are relative to
    scans: list[DirScan]

    def files(self) -> list[tuple[str, int]]:
        """``(relpath, size)`` of every hashed file, in hash order."""
        return [(d.rel + n, s[1]) for d in self.scans for n, s in zip(d.names, d.sigs, strict=True)]


class _Hasher:
    """Collects per-directory digests as the walk goes; big files finish on a pool."""

    def __init__(self, label: str, base: str, record: TreeRecord | None, verify: bool):
        self.label, self.base, self.record, self.verify = label, base, record, verify
        self.scans: list[DirScan] = []
        self.blobs: list[bytes | list[bytes | None]] = []
        self.unstable: set[tuple[int, int]] = set()
        self.changed = record is None
        self.pending: list[tuple[int, int, Future[tuple[bytes, bool]]]] = []
        self.pool: ThreadPoolExecutor | None = None

    def directory(self, scan: DirScan, dir_fd: int | None) -> None:
        i = len(self.scans)
        self.scans.append(scan)
        old = self._old(scan)
        unchanged = old is not None and old.names == scan.names
        if unchanged and old is not None and old.fingerprint == fingerprint(scan.sigs):
            self.blobs.append(old.digests)  # nothing in this directory changed
            return
        self.changed = True
        known: dict[str, tuple[Sig, int]] = {}
        if old is not None:
            try:
                sigs = old.sigs()
            except Exception as exc:  # noqa: BLE001 - a damaged record is no record
                log.debug("stat cache record for %s unusable: %s", self.label, exc)
                self.record, old = None, None
            else:
                known = {n: (s, k) for k, (n, s) in enumerate(zip(old.names, sigs, strict=True))}
        digests: list[bytes | None] = []
        for j, (name, sig) in enumerate(zip(scan.names, scan.sigs, strict=True)):
            hit = known.get(name)
            if hit is not None and hit[0] == sig:
                assert old is not None
                digests.append(old.digests[32 * hit[1] : 32 * hit[1] + 32])
                continue
            relb = relpath_bytes(self.label, scan.rel, name)
            where = self.base + scan.rel + name
            if sig[1] >= THREAD_FILE:
                digests.append(None)
                self._submit(i, j, where, relb, sig)
                continue
            name_or_path = name if dir_fd is not None else where
            digest, stable = file_digest(
                name_or_path, relb, sig, self.label, dir_fd, self.verify, where
            )
            digests.append(digest)
            if not stable:
                self.unstable.add((i, j))
        self.blobs.append(digests)

    def fresh(self, done: FreshDir) -> None:
        """A directory ``fresh_dir`` hashed itself (nothing cached); its big and
        symlinked files still go to the pool."""
        i = len(self.scans)
        self.scans.append(done.scan)
        self.blobs.append(done.digests)
        self.unstable.update((i, j) for j in done.unstable)
        for j in done.big:
            name, sig = done.scan.names[j], done.scan.sigs[j]
            relb = relpath_bytes(self.label, done.scan.rel, name)
            self._submit(i, j, self.base + done.scan.rel + name, relb, sig)

    def _old(self, scan: DirScan) -> DirView | None:
        if self.record is None:
            return None
        old = self.record.dirs.get(scan.rel)
        return old if old is not None and old.dev == scan.dev else None

    def _submit(self, i: int, j: int, path: str, relb: bytes, sig: Sig) -> None:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="kinetic-hash")
        fut = self.pool.submit(file_digest, path, relb, sig, self.label, None, self.verify, path)
        self.pending.append((i, j, fut))

    def finish(self) -> list[bytes]:
        """Wait for pooled digests; every directory's digests as one blob."""
        try:
            for i, j, fut in self.pending:
                digest, stable = fut.result()
                self.blobs[i][j] = digest  # type: ignore[index]
                if not stable:
                    self.unstable.add((i, j))
        finally:
            self.close()
        return [b if isinstance(b, bytes) else b"".join(b) for b in self.blobs]  # type: ignore[misc]

    def close(self) -> None:
        if self.pool is not None:
            for _, _, fut in self.pending:
                fut.cancel()
            self.pool.shutdown(wait=True)
            self.pool = None


def _walk(root: str, label: str, hasher: _Hasher, facts: Facts) -> None:
    """Kinetic's order (pre-order, sorted).  With no record at all (a first hash) each
    directory is listed and hashed by ``fresh_dir``; otherwise every entry is
    ``lstat``-ed first so unchanged directories are recognised without reading a
    file, and a directory whose own facts are the record's is not even listed."""
    stack: list[tuple[str, str, Facts | None]] = [("", root, facts)]
    while stack:
        rel, path, dfacts = stack.pop()
        fd = open_dir(path, rel, label)
        try:
            if hasher.record is None:
                done = fresh_dir(fd, path, rel, label, THREAD_FILE, dfacts)
                hasher.fresh(done)
                subdirs = done.subdirs
            else:
                old = hasher.record.dirs.get(rel)
                same = old is not None and dfacts is not None and old.facts == dfacts
                entries = old.entries if same and old is not None else None
                scan, subdirs = stat_dir(fd, path, rel, label, dfacts, entries)
                hasher.directory(scan, fd)
        finally:
            os.close(fd)
        for name, sub_facts in reversed(subdirs):
            stack.append((f"{rel}{name}/", os.path.join(path, name), sub_facts))


def content_hash(path: str, label: str, cache: StatCache | None) -> TreeHash:
    """kinetic's content hash of the file or directory ``path`` (absolute).

    ``label`` is the Data path as the user wrote it (for error messages).
    """
    limit = cache.racy_limit() if cache else 0
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _unreadable(label, path, exc) from exc
    if S_ISDIR(st.st_mode):
        kind, root = "dir", path
    elif S_ISREG(st.st_mode):
        kind, root = "file", os.path.dirname(path)
    else:
        raise _special(label, path, st.st_mode, is_root=True)
    record = cache.load(path, st.st_dev, kind) if cache else None
    hasher = _Hasher(label, root if root.endswith(os.sep) else root + os.sep, record, bool(cache))
    collecting = gc.isenabled()
    gc.disable()  # the walk allocates a tuple per file and keeps them all: skip GC passes
    try:
        if kind == "dir":
            _walk(path, label, hasher, dir_facts(st))
        else:
            sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev)
            name = os.path.basename(path)
            hasher.directory(DirScan("", st.st_dev, [name], [sig], [name]), None)
        blobs = hasher.finish()
    finally:
        hasher.close()
        if collecting:
            gc.enable()
    combined = hashlib.sha256(b"dir:" if kind == "dir" else b"file:")
    combined.update(b"".join(blobs))
    if cache is not None and hasher.changed:
        dirs = []
        for i, (scan, blob) in enumerate(zip(hasher.scans, blobs, strict=True)):
            sigs = [
                NEVER if (i, j) in hasher.unstable or s[2] >= limit or s[3] >= limit else s
                for j, s in enumerate(scan.sigs)
            ]
            facts = scan.facts
            if facts is not None and (facts[2] >= limit or facts[3] >= limit):
                facts = None  # racy: a change now might not move its timestamps
            dirs.append(DirRecord(scan.rel, scan.dev, scan.names, sigs, blob, scan.entries, facts))
        cache.save(path, st.st_dev, kind, dirs)
    return TreeHash(combined.hexdigest(), root, hasher.scans)
