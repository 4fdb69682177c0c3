"""kinetic 0.0.4's content hash, computed in one pass, reading only what changed.

The hash (unchanged from kinetic, so data caches are shared): each file's digest is
``sha256(relpath + b"\\0" + bytes)``; a directory's hash is ``sha256(b"dir:" + d1 +
d2 ...)`` in kinetic's walk order (``core/data/hashing/treewalk.py``); a single file's is
``sha256(b"file:" + digest)`` with its basename as relpath.

One pass over the tree: each directory is listed and its entries ``lstat``-ed once;
with a :class:`~airflow_provider_kinetic.core.data.hashing.statcache.StatCache`, a directory whose
names and stat facts all equal the record's reuses its digests without opening a
file, and in a changed directory only the files whose facts changed are read.  A
re-hash of unchanged data is then one ``lstat`` per file, which sets its floor: a
directory of files only whose own facts are the record's is not listed, and its
``lstat`` results are compared with the record in one go (:func:`_unchanged`; by
the optional C extension where it is built, ``core/data/hashing/fastlstat.py``, which skips
building an ``os.stat_result`` per file); when every directory is unchanged the hash
stored with the record is the answer.  Small files are read (relative to the open
directory) and hashed right away, in this thread: per-file Python work dominates
them and threads would only fight over the GIL.  Files of ``THREAD_FILE`` bytes or
more go to a thread pool meanwhile (reading and hashing release the GIL), so a tree
of big files uses every core.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from stat import S_ISDIR, S_ISREG

from airflow_provider_kinetic.core.data.hashing import fastlstat
from airflow_provider_kinetic.core.data.hashing.statcache import (
    NEVER,
    DirRecord,
    DirView,
    RecordError,
    Sig,
    StatCache,
    TreeRecord,
    fingerprint,
)
from airflow_provider_kinetic.core.data.hashing.treewalk import (
    DataPathError,
    DataReadError,
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

    def empty_dirs(self) -> list[str]:
        """Directories below the root with no entry at all (``"a/b"``), in walk order:
        what a download of the files alone would not recreate (parents of a listed one
        come with it)."""
        return [d.rel.rstrip("/") for d in self.scans if d.rel and d.empty]


#: A file's digest known without reading it (``FileDigests.lookup``): its path, its
#: ``relpath + NUL`` prefix and its ``lstat`` signature, or None to read it.
Known = Callable[[str, bytes, Sig], "bytes | None"]


class _Hasher:
    """Collects per-directory digests as the walk goes; big files finish on a pool."""

    def __init__(
        self,
        label: str,
        base: str,
        record: TreeRecord | None,
        verify: bool,
        known: Known | None = None,
    ):
        self.label, self.base, self.record, self.verify = label, base, record, verify
        self.known = known
        self.scans: list[DirScan] = []
        #: Per directory: its digests, or the record's view whose digests stand.
        self.blobs: list[bytes | DirView | list[bytes | memoryview | None]] = []
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
            self.blobs.append(old)  # nothing in this directory changed: its digests
            return
        self.changed = True
        known: dict[str, tuple[Sig, int]] = {}
        recorded = memoryview(b"")
        if old is not None:  # RecordError here: content_hash starts over without it
            sigs, recorded = old.sigs(), old.digests
            known = {n: (s, k) for k, (n, s) in enumerate(zip(old.names, sigs, strict=True))}
        digests: list[bytes | memoryview | None] = []
        for j, (name, sig) in enumerate(zip(scan.names, scan.sigs, strict=True)):
            hit = known.get(name)
            if hit is not None and hit[0] == sig:
                digests.append(recorded[32 * hit[1] : 32 * hit[1] + 32])
                continue
            relb = relpath_bytes(self.label, scan.rel, name)
            where = self.base + scan.rel + name
            if self.known is not None and (given := self.known(where, relb, sig)) is not None:
                digests.append(given)  # hashed as it was downloaded: not read again
                continue
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

    def reuse(self, scan: DirScan, old: DirView) -> None:
        """A directory :func:`_unchanged` vouched for: its recorded digests stand."""
        self.scans.append(scan)
        self.blobs.append(old)

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

    def finish(self) -> list[bytes | memoryview]:
        """Wait for pooled digests; every directory's digests as one blob (a record's
        digests are read here, if at all: RecordError when they prove unusable)."""
        try:
            for i, j, fut in self.pending:
                digest, stable = fut.result()
                self.blobs[i][j] = digest  # type: ignore[index]
                if not stable:
                    self.unstable.add((i, j))
        finally:
            self.close()
        return [
            b.digests if isinstance(b, DirView) else b if isinstance(b, bytes) else b"".join(b)  # type: ignore[misc]
            for b in self.blobs
        ]

    def close(self) -> None:
        if self.pool is not None:
            for _, _, fut in self.pending:
                fut.cancel()
            self.pool.shutdown(wait=True)
            self.pool = None


#: A file's signature from its ``lstat``, taken by C code (no bytecode per file).
_SIG_OF = attrgetter("st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def lstat_sigs(fd: int, names: list[bytes] | list[str]) -> list[Sig] | None:
    """The ``lstat`` signatures of ``names`` (relative to ``fd``, links not followed),
    or None when one is gone.  Unlike :func:`stat_dir` it checks no entry type, so it
    may only vouch for a directory when its result *equals* signatures recorded for
    regular files: an entry whose inode, size, mtime and ctime all equal a regular
    file's is that file (an inode's type never changes, and an inode number reused by
    a new file comes with a new ctime)."""
    lstat = os.lstat
    try:
        return list(map(_SIG_OF, [lstat(name, dir_fd=fd) for name in names]))
    except OSError:
        return None


def _native_compare(fd: int, old: DirView) -> int | None:
    """``fastlstat.compare`` of a files-only directory with its record, or None when
    the Python path must decide (not built, symlinked files, record unreadable)."""
    if not fastlstat.available():
        return None
    try:
        arrays = old.plain_arrays()
    except RecordError:
        return None
    return None if arrays is None else fastlstat.compare(fd, old.os_entries, *arrays)


def _unchanged(
    fd: int, path: str, rel: str, label: str, facts: Facts | None, old: DirView | None
) -> DirScan | bool:
    """The fast path of a re-hash, for a directory of files only whose own facts are
    the record's (so its listing is too): one ``lstat`` per file and one comparison.

    Returns the directory's scan when every file's signature is the record's; else
    whether the recorded listing may still be used (False: a file vanished meanwhile,
    so :func:`stat_dir` must list the directory again)."""
    same = old is not None and facts is not None and old.facts == facts and old.dev == facts[0]
    if not same or old is None or facts is None or not old.files_only:
        return same
    verdict = _native_compare(fd, old)
    if verdict is not None:
        if verdict != fastlstat.SAME:
            return verdict == fastlstat.DIFFERENT
    else:
        sigs = lstat_sigs(fd, old.os_entries)
        if sigs is None or fingerprint(sigs) != old.fingerprint:
            return sigs is not None

    def recorded() -> list[Sig]:
        """The signatures, read only if used: the record's (equal to the files') while
        it is open, as for a save; after the hash (an upload's file list, the record
        closed) or if they prove unreadable, the files' own, taken again."""
        try:
            return old.sigs()
        except RecordError:
            again = open_dir(path, rel, label)
            try:
                sigs = lstat_sigs(again, old.os_entries)
            finally:
                os.close(again)
            if sigs is None:
                raise DataReadError(
                    errno.ENOENT, f"Data path {label!r}: {path!r} changed"
                ) from None
            return sigs

    listing = (lambda: old.entries) if old.os_entries else []  # DirScan.empty reads it
    return DirScan(rel, facts[0], lambda: old.names, recorded, listing, facts)


def _walk(root: str, label: str, hasher: _Hasher, facts: Facts) -> None:
    """Kinetic's order (pre-order, sorted).  With no record at all (a first hash) each
    directory is listed and hashed by ``fresh_dir``; otherwise every entry is
    ``lstat``-ed first so unchanged directories are recognised without reading a
    file (by :func:`_unchanged` where it can), and a directory whose own facts are
    the record's is not even listed."""
    stack: list[tuple[str, str, Facts | None]] = [("", root, facts)]
    while stack:
        rel, path, dfacts = stack.pop()
        fd = open_dir(path, rel, label)
        try:
            if hasher.record is None and hasher.known is None:
                done = fresh_dir(fd, path, rel, label, THREAD_FILE, dfacts)
                hasher.fresh(done)
                subdirs = done.subdirs
            else:
                old = hasher.record.dirs.get(rel) if hasher.record is not None else None
                quick = _unchanged(fd, path, rel, label, dfacts, old)
                if isinstance(quick, DirScan) and old is not None:
                    hasher.reuse(quick, old)
                    continue  # files only: no subdirectories to visit
                entries = old.entries if quick and old is not None else None
                scan, subdirs = stat_dir(fd, path, rel, label, dfacts, entries)
                hasher.directory(scan, fd)
        finally:
            os.close(fd)
        for name, sub_facts in reversed(subdirs):
            stack.append((f"{rel}{name}/", os.path.join(path, name), sub_facts))


def content_hash(
    path: str, label: str, cache: StatCache | None, known: Known | None = None
) -> TreeHash:
    """kinetic's content hash of the file or directory ``path`` (absolute).

    ``label`` is the Data path as the user wrote it (for error messages).  ``known``:
    digests of files taken as they were downloaded (``core.storage.FileDigests``);
    a file it answers for is not read, every other one is.
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
    try:
        return _hash(path, label, cache, limit, st, kind, root, record, known)
    except RecordError as exc:  # its digests proved unusable: hash as without it
        log.debug("stat cache record for %s unusable: %s", label, exc)
        return _hash(path, label, cache, limit, st, kind, root, None, known)
    finally:
        if record is not None:
            record.close()


def _hash(
    path: str,
    label: str,
    cache: StatCache | None,
    limit: int,
    st: os.stat_result,
    kind: str,
    root: str,
    record: TreeRecord | None,
    known: Known | None = None,
) -> TreeHash:
    base = root if root.endswith(os.sep) else root + os.sep
    hasher = _Hasher(label, base, record, bool(cache), known)
    collecting = gc.isenabled()
    gc.disable()  # the walk allocates a tuple per file and keeps them all: skip GC passes
    try:
        if kind == "dir":
            _walk(path, label, hasher, dir_facts(st))
        else:
            sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev)
            name = os.path.basename(path)
            hasher.directory(DirScan("", st.st_dev, [name], [sig], [name]), None)
        if record is not None and not hasher.changed and _same_dirs(hasher, record):
            return TreeHash(record.hexdigest, root, hasher.scans)  # every digest is the record's
        blobs = hasher.finish()
    finally:
        hasher.close()
        if collecting:
            gc.enable()
    combined = hashlib.sha256(b"dir:" if kind == "dir" else b"file:")
    combined.update(b"".join(blobs))
    hexdigest = combined.hexdigest()
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
        cache.save(path, st.st_dev, kind, dirs, hexdigest)
    return TreeHash(hexdigest, root, hasher.scans)


def _same_dirs(hasher: _Hasher, record: TreeRecord) -> bool:
    """The walk met exactly the record's directories, in its order (none added or
    removed), so the hash of their digests is the one stored with the record."""
    return (
        bool(record.hexdigest)
        and len(hasher.scans) == len(record.dirs)
        and all(scan.rel == rel for scan, rel in zip(hasher.scans, record.dirs, strict=True))
    )
