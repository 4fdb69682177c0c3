"""A persistent per-machine stat cache for content hashes: skip re-reading unchanged files.

Hashing a tree reads every byte; re-submitting unchanged data (each DAG run builds a
fresh ``Data``) would pay that again.  This cache remembers, per tree root, each
file's kinetic digest together with the ``lstat`` facts that identify its content
(inode, size, mtime_ns, ctime_ns, and the device of its directory).  A digest is
trusted only when every one of those facts is identical *now*, so it can never be
stale:

- a changed byte with size and mtime restored: the write and the ``utime`` both set
  ctime, which user code cannot set back;
- an added, removed or renamed file: the directory's listing differs;
- a replaced file or directory: new inodes;
- a concurrent writer, or a change inside the file system's timestamp granularity:
  files whose mtime or ctime is within ``racy_ns`` of the clock are *racy* and never
  stored (git's "racy clean" rule), so a later write must move ctime to a value the
  cache has never seen.

The tree's hash is stored too, and returned only when every directory the walk met
is the record's (same directories, same listings, every file's facts identical).

It describes files on one machine, so it lives on that machine (never in the shared
object store): ``$KINETIC_STATCACHE_DIR``, else ``$AIRFLOW_HOME/kinetic/.statcache``,
else the user's cache directory.  One file per tree root (keyed by the root's device
and absolute path), written to a temporary name and renamed into place, so concurrent
processes never see a torn record (the last writer wins; every record is verified
entry by entry on use).  The format (``core/data/hashing/statrecord.py``) is a small binary layout
parsed without evaluating anything, guarded by checksums.  Any cache problem means
"no cache": callers hash instead.  Stdlib only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.data.hashing.statrecord import (
    NEVER,
    DirRecord,
    DirView,
    RecordError,
    Sig,
    TreeRecord,
    decode,
    encode,
    fingerprint,
    read_record,
)

__all__ = [
    "NEVER",
    "DirRecord",
    "DirView",
    "RecordError",
    "Sig",
    "StatCache",
    "TreeRecord",
    "decode",
    "default_dir",
    "encode",
    "fingerprint",
]

log = logging.getLogger(__name__)

ENV_DIR = "KINETIC_STATCACHE_DIR"
#: Values of ``$KINETIC_STATCACHE_DIR`` that turn the cache off.
OFF_VALUES = ("", "0", "off", "none", "false")
#: Files touched this recently are rehashed and never stored (timestamp granularity,
#: clock steps between this host and a network file system).
RACY_NS = 2_000_000_000
MAX_RECORDS = 256
#: Trees larger than this are hashed without a cache (bounds the record size).
MAX_FILES = 2_000_000

_SUFFIX = ".stc"
_TMP_SUFFIX = ".stc-tmp"
_STALE_TMP_S = 3600.0


def default_dir() -> str | None:
    """Where the cache lives by default, or ``None`` when it is switched off."""
    configured = os.environ.get(ENV_DIR)
    if configured is not None:
        return None if configured.strip().lower() in OFF_VALUES else configured
    home = os.environ.get("AIRFLOW_HOME")
    if home:
        return os.path.join(home, "kinetic", ".statcache")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "airflow-provider-kinetic", "statcache")


class StatCache:
    """The on-disk cache in ``directory`` (created 0700 on first save).

    Args:
        directory: where records live; one file per tree root.
        racy_ns: files whose mtime or ctime is this close to the clock are not stored.
        clock: wall clock in ns (tests move it to make fresh files count as old).
        max_records: the least recently used records beyond this are removed.
    """

    def __init__(
        self,
        directory: str,
        *,
        racy_ns: int = RACY_NS,
        clock: Callable[[], int] = time.time_ns,
        max_records: int = MAX_RECORDS,
    ) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.racy_ns, self.clock, self.max_records = racy_ns, clock, max_records

    def __repr__(self) -> str:
        return f"StatCache({self.directory!r})"

    @classmethod
    def default(cls) -> StatCache | None:
        """The cache at :func:`default_dir`, or ``None`` when switched off."""
        directory = default_dir()
        return cls(directory) if directory else None

    def racy_limit(self) -> int:
        """Timestamps at or after this (ns) are racy.  Taken before a scan starts."""
        return self.clock() - self.racy_ns

    def path_for(self, root: str, dev: int) -> str:
        key = hashlib.sha256(f"{dev}\0{root}".encode("utf-8", "surrogateescape")).hexdigest()
        return os.path.join(self.directory, key[:40] + _SUFFIX)

    def load(self, root: str, dev: int, kind: str) -> TreeRecord | None:
        """The record for ``root`` on device ``dev``, or ``None`` (absent, foreign,
        corrupt, unreadable: never an error).  It keeps the record file open until
        its digests are first read, or until ``close()``."""
        path = self.path_for(root, dev)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_uid != os.getuid():
                raise ValueError("planted by another user in a shared directory")
            record = read_record(fd)  # owns fd from here on
        except Exception as exc:  # noqa: BLE001 - any problem means "no cache"
            log.debug("stat cache %s unusable: %s", path, exc)
            os.close(fd)
            return None
        if (record.root, record.dev, record.kind) != (root, dev, kind):
            record.close()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently *used* is what pruning removes
        metrics.incr("kinetic.data.stat_cache_hits")  # unchanged files are not read again
        return record

    def save(
        self, root: str, dev: int, kind: str, dirs: list[DirRecord], hexdigest: str = ""
    ) -> bool:
        """Store a record atomically; returns False (and logs) when it could not."""
        if sum(len(d.names) for d in dirs) > MAX_FILES:
            return False
        path = self.path_for(root, dev)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        try:
            blob = encode(root, dev, kind, dirs, hexdigest)
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written is no cache
            log.debug("stat cache %s not written: %s", path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        self._prune()
        return True

    def _prune(self) -> None:
        """Keep at most ``max_records`` records (least recently used go first) and
        remove temporary files a killed writer left an hour or more ago."""
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        now = time.time()
        records = []
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.name.endswith(_TMP_SUFFIX):
                    if now - entry.stat().st_mtime > _STALE_TMP_S:
                        os.unlink(entry.path)
                elif entry.name.endswith(_SUFFIX):
                    records.append((entry.stat().st_mtime_ns, entry.path))
        if len(records) > self.max_records:
            records.sort()
            for _, path in records[: len(records) - self.max_records]:
                with contextlib.suppress(OSError):
                    os.unlink(path)
