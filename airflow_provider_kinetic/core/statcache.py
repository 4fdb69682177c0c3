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

It describes files on one machine, so it lives on that machine (never in the shared
object store): ``$KINETIC_STATCACHE_DIR``, else ``$AIRFLOW_HOME/kinetic/.statcache``,
else the user's cache directory.  One file per tree root (keyed by the root's device
and absolute path), written to a temporary name and renamed into place, so concurrent
processes never see a torn record (the last writer wins; every record is verified
entry by entry on use).  The format is a small binary layout parsed without
evaluating anything, guarded by a checksum.  Any cache problem means "no cache":
callers hash instead.  Stdlib only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import marshal
import os
import secrets
import struct
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

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
#: A signature no real file has (size -1): stored for racy files so they never match.
NEVER = (0, -1, -1, -1)

_MAGIC = b"KSTATC03"
#: Lengths of: JSON header, fingerprints, names, digests | inodes + sizes and times.
_HEAD = struct.Struct("<5Q")
_CRC = struct.Struct("<I")
_SUFFIX = ".stc"
_TMP_SUFFIX = ".stc-tmp"
_STALE_TMP_S = 3600.0

#: ``(inode, size, mtime_ns, ctime_ns)`` of a regular file; a symlinked file adds its
#: target's ``st_dev`` (the target may live on another device).
Sig = tuple[int, ...]


def fingerprint(sigs: list[Sig]) -> bytes:
    """An exact, compact form of a directory's signatures, cheap to compare.

    marshal format 2 writes ints and tuples without back-references, so equal values
    always give equal bytes and different values different bytes.  It is compared,
    never loaded.
    """
    return marshal.dumps(sigs, 2)


@dataclass
class DirRecord:
    """One directory to store: its hashed files in kinetic's (sorted) order, their
    signatures (``NEVER`` for racy files) and 32-byte digests."""

    rel: str  # "" for the root, else "a/b/" (POSIX, trailing slash)
    dev: int
    names: list[str]
    sigs: list[Sig]
    digests: bytes
    #: The whole sorted listing (files, subdirectories, links), and the directory's
    #: own (dev, inode, mtime_ns, ctime_ns), None when racy: while those facts hold,
    #: the listing need not be read again.
    entries: list[str] | None = None
    facts: tuple[int, ...] | None = None


@dataclass
class DirView:
    """One directory of a loaded record.  ``fingerprint`` decides a whole-directory
    hit; the signatures themselves are decoded only when a directory changed."""

    rel: str
    dev: int
    names: list[str]
    fingerprint: bytes
    digests: bytes
    entries: list[str]
    facts: tuple[int, ...] | None
    _record: TreeRecord = field(repr=False)
    _at: int = field(repr=False)
    _links: list[list[int]] = field(repr=False)

    def sigs(self) -> list[Sig]:
        inodes, numbers = self._record.arrays()
        at, n = self._at, len(self.names)
        it = iter(numbers[3 * at : 3 * (at + n)])
        # One iterator passed three times: each tuple takes the next three values.
        sigs: list[Sig] = list(zip(inodes[at : at + n], it, it, it, strict=False))
        for i, link_dev in self._links:
            sigs[i] = (*sigs[i], link_dev)
        return sigs


@dataclass
class TreeRecord:
    """What the cache holds for one root (a directory tree, or a single file)."""

    root: str
    dev: int
    kind: str  # "dir" or "file"
    dirs: dict[str, DirView]
    _slow: memoryview | None = field(default=None, repr=False)
    _arrays: tuple[array, array] | None = field(default=None, repr=False)

    def arrays(self) -> tuple[array, array]:
        """Inode and (size, mtime, ctime) arrays, checked and decoded on first use."""
        if self._arrays is None:
            slow = self._slow
            if slow is None or len(slow) < _CRC.size:
                raise ValueError("stat cache record has no signatures")
            body = slow[: -_CRC.size]
            if zlib.crc32(body) != _CRC.unpack_from(slow, len(body))[0]:
                raise ValueError("stat cache record checksum mismatch")
            total = sum(len(d.names) for d in self.dirs.values())
            if len(body) != 32 * total:
                raise ValueError("stat cache record counts do not add up")
            inodes, numbers = array("Q"), array("q")
            inodes.frombytes(body[: 8 * total])
            numbers.frombytes(body[8 * total :])
            self._arrays = (inodes, numbers)
        return self._arrays


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


def _others(entries: list[str], names: list[str]) -> list[int]:
    """Indices of ``entries`` that are not among ``names`` (a sorted subsequence)."""
    others, j = [], 0
    for i, entry in enumerate(entries):
        if j < len(names) and names[j] == entry:
            j += 1
        else:
            others.append(i)
    if j != len(names):
        raise ValueError("file names are not a subsequence of the listing")
    return others


def encode(root: str, dev: int, kind: str, dirs: list[DirRecord]) -> bytes:
    """The record as bytes.  Two CRC32s: one over what a hit reads (header,
    fingerprints, listings, digests), one over the signatures only a change decodes."""
    fps = [fingerprint(d.sigs) for d in dirs]
    listings = [d.names if d.entries is None else d.entries for d in dirs]
    header = json.dumps(
        {"root": root, "dev": dev, "kind": kind,
         "dirs": [[d.rel, d.dev, len(d.names), len(fp),
                   [[i, s[4]] for i, s in enumerate(d.sigs) if len(s) > 4],
                   len(listing), _others(listing, d.names), d.facts]
                  for d, fp, listing in zip(dirs, fps, listings, strict=True)]},
        ensure_ascii=False,
    ).encode("utf-8", "surrogateescape")  # fmt: skip
    inodes, numbers = array("Q"), array("q")
    for d in dirs:
        for sig in d.sigs:
            inodes.append(sig[0])
            numbers.extend(sig[1:4])
    entries = "\0".join(e for listing in listings for e in listing)
    fast = [header, b"".join(fps), entries.encode("utf-8", "surrogateescape"),
            b"".join(d.digests for d in dirs)]  # fmt: skip
    slow = inodes.tobytes() + numbers.tobytes()
    head = b"".join([_MAGIC, _HEAD.pack(*(len(p) for p in fast), len(slow)), *fast])
    return head + _CRC.pack(zlib.crc32(head)) + slow + _CRC.pack(zlib.crc32(slow))


def decode(blob: bytes) -> TreeRecord:
    """Parse :func:`encode`'s bytes; raises ``ValueError`` on anything unexpected.

    Reads what a hit needs; the signatures are checked and decoded on first use.
    """
    start = len(_MAGIC) + _HEAD.size
    if len(blob) < start + 2 * _CRC.size or not blob.startswith(_MAGIC):
        raise ValueError("not a stat cache record")
    lengths = _HEAD.unpack_from(blob, len(_MAGIC))
    fast_end = start + sum(lengths[:4])
    if fast_end + _CRC.size + lengths[4] + _CRC.size != len(blob):
        raise ValueError("stat cache record lengths do not add up")
    view = memoryview(blob)
    if zlib.crc32(view[:fast_end]) != _CRC.unpack_from(blob, fast_end)[0]:
        raise ValueError("stat cache record checksum mismatch")
    ends = [start + sum(lengths[: i + 1]) for i in range(4)]
    header = json.loads(bytes(view[start : ends[0]]).decode("utf-8", "surrogateescape"))
    fps = bytes(view[ends[0] : ends[1]])
    entries = bytes(view[ends[1] : ends[2]]).decode("utf-8", "surrogateescape").split("\0")
    digests = bytes(view[ends[2] : ends[3]])
    total = sum(d[2] for d in header["dirs"])
    if not sum(d[5] for d in header["dirs"]):
        entries = []
    if len(digests) != 32 * total or lengths[4] != 32 * total:
        raise ValueError("stat cache record counts do not add up")
    record = TreeRecord(header["root"], header["dev"], header["kind"], {}, view[fast_end + 4 :])
    at = fp_at = e_at = 0
    for rel, dev, n, fp_len, links, n_entries, others, facts in header["dirs"]:
        listing = entries[e_at : e_at + n_entries]
        names = listing
        if others:
            skip = set(others)
            names = [e for i, e in enumerate(listing) if i not in skip]
        if len(names) != n or len(listing) != n_entries:
            raise ValueError("stat cache record counts do not add up")
        record.dirs[rel] = DirView(
            rel, dev, names, fps[fp_at : fp_at + fp_len], digests[32 * at : 32 * (at + n)],
            listing, tuple(facts) if facts is not None else None, record, at, links,
        )  # fmt: skip
        at, fp_at, e_at = at + n, fp_at + fp_len, e_at + n_entries
    if fp_at != len(fps) or e_at != len(entries):
        raise ValueError("stat cache record counts do not add up")
    return record


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
        self.racy_ns = racy_ns
        self.clock = clock
        self.max_records = max_records

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
        corrupt, unreadable: never an error)."""
        path = self.path_for(root, dev)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_uid != os.getuid():
                return None  # planted by another user in a shared directory: ignore
            chunks = []
            while chunk := os.read(fd, 1 << 22):
                chunks.append(chunk)
            record = decode(b"".join(chunks))
        except Exception as exc:  # noqa: BLE001 - any problem means "no cache"
            log.debug("stat cache %s unusable: %s", path, exc)
            return None
        finally:
            os.close(fd)
        if (record.root, record.dev, record.kind) != (root, dev, kind):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently *used* is what pruning removes
        return record

    def save(self, root: str, dev: int, kind: str, dirs: list[DirRecord]) -> bool:
        """Store a record atomically; returns False (and logs) when it could not."""
        if sum(len(d.names) for d in dirs) > MAX_FILES:
            return False
        path = self.path_for(root, dev)
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        try:
            blob = encode(root, dev, kind, dirs)
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
