"""The stat cache's record of one tree root, as bytes on disk and as loaded.

Laid out for the common case, a re-hash of unchanged data: what it uses (a small JSON
header with the tree's hash, each directory's signature fingerprint and its listing)
comes first under its own CRC32; the digests and the signatures follow under a second
CRC32 and are read (through the descriptor the first part was read from) and checked
only when first used: where something changed, or where the native comparison
(``core/data/hashing/fastlstat.py``) compares files with the signatures in place::

    MAGIC | lengths (5 x u64) | header | fingerprints | listings | CRC1
          | digests | inodes (u64) | sizes, mtimes, ctimes (i64) | CRC2

Parsed without evaluating anything.  A record file is never modified in place (a new
one is renamed over it), so a descriptor keeps reading the record it was opened on.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from functools import cached_property

#: A signature no real file has (size -1): stored for racy files so they never match.
NEVER = (0, -1, -1, -1)
#: ``(inode, size, mtime_ns, ctime_ns)`` of a regular file; a symlinked file adds its
#: target's ``st_dev`` (the target may live on another device).
Sig = tuple[int, ...]

_MAGIC = b"KSTATC05"
#: Lengths of: JSON header, fingerprints, listings | digests, signatures.
_HEAD = struct.Struct("<5Q")
_CRC = struct.Struct("<I")
_START = len(_MAGIC) + _HEAD.size
#: Listings are kept as bytes (``os.lstat`` takes them without encoding each name)
#: where that is how the OS names files.
_BYTES_NAMES = os.name == "posix" and sys.getfilesystemencoding() == "utf-8"


class RecordError(ValueError):
    """A record that cannot be used (damaged, truncated, unreadable): no cache."""


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
    digests: bytes | memoryview
    #: The whole sorted listing (files, subdirectories, links), and the directory's
    #: own (dev, inode, mtime_ns, ctime_ns), None when racy: while those facts hold,
    #: the listing need not be read again.
    entries: list[str] | None = None
    facts: tuple[int, ...] | None = None


@dataclass
class DirView:
    """One directory of a loaded record.  ``fingerprint`` decides a whole-directory
    hit; names are decoded, and digests and signatures read, only when asked."""

    rel: str
    dev: int
    _fp: memoryview = field(repr=False)
    facts: tuple[int, ...] | None
    #: The listing as the OS names files (bytes on POSIX), for ``lstat``.
    os_entries: list[bytes] | list[str] = field(repr=False)
    _others: list[int] = field(repr=False)
    _record: TreeRecord = field(repr=False)
    _at: int = field(repr=False)  # index of its first file in the record
    _links: list[list[int]] = field(repr=False)

    @property
    def fingerprint(self) -> bytes:
        return bytes(self._fp)  # bytes compare with memcmp, memoryviews byte by byte

    @property
    def files_only(self) -> bool:
        """Every entry of the listing is a hashed file (no subdirectory or skipped link)."""
        return not self._others

    @property
    def count(self) -> int:
        return len(self.os_entries) - len(self._others)

    @property
    def digests(self) -> memoryview:
        """This directory's digests (a view into the record; may raise RecordError)."""
        return self._record.rest()[32 * self._at : 32 * (self._at + self.count)]

    @cached_property
    def entries(self) -> list[str]:
        """The whole sorted listing (files, subdirectories, links)."""
        if not _BYTES_NAMES or not self.os_entries:
            return list(self.os_entries)  # type: ignore[arg-type]
        raw = b"\0".join(self.os_entries)  # type: ignore[arg-type]
        return raw.decode("utf-8", "surrogateescape").split("\0")

    @cached_property
    def names(self) -> list[str]:
        """The hashed files, in hash order (the listing less the ``others``)."""
        if not self._others:
            return self.entries
        skip = set(self._others)
        return [e for i, e in enumerate(self.entries) if i not in skip]

    def plain_arrays(self) -> tuple[array, array, int] | None:
        """The record's inode and (size, mtime, ctime) arrays and this directory's first
        index in them, for a comparison in place; None when a file here is a symlink
        (its signature has a fifth field, the target's device).  May raise RecordError."""
        if self._links:
            return None
        return (*self._record.arrays(), self._at)

    def sigs(self) -> list[Sig]:
        """The recorded signatures (may raise RecordError)."""
        inodes, numbers = self._record.arrays()
        at, n = self._at, self.count
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
    #: The tree's content hash when the record was written ("" if not stored): a
    #: re-hash that found every directory unchanged returns it as it is.
    hexdigest: str = ""
    total: int = 0  # files in the record
    #: Where the digests and signatures come from: bytes in memory, or (fd, offset).
    _source: memoryview | tuple[int, int] | None = field(default=None, repr=False)
    _rest: memoryview | None = field(default=None, repr=False)
    _arrays: tuple[array, array] | None = field(default=None, repr=False)

    def rest(self) -> memoryview:
        """Digests and signatures, read and checked on first use."""
        if self._rest is None:
            source, self._source = self._source, None
            if source is None:
                raise RecordError("stat cache record has no digests (or they were damaged)")
            if isinstance(source, tuple):
                size = 64 * self.total + _CRC.size
                try:
                    data = memoryview(os.pread(source[0], size, source[1]))
                except OSError as exc:
                    raise RecordError(f"stat cache record unreadable: {exc}") from exc
                finally:
                    os.close(source[0])
            else:
                data = source
            if len(data) != 64 * self.total + _CRC.size:
                raise RecordError("stat cache record is truncated")
            if zlib.crc32(data[: -_CRC.size]) != _CRC.unpack_from(data, len(data) - 4)[0]:
                raise RecordError("stat cache record checksum mismatch")
            self._rest = data[: -_CRC.size]
        return self._rest

    def arrays(self) -> tuple[array, array]:
        """Inode and (size, mtime, ctime) arrays, decoded on first use."""
        if self._arrays is None:
            body = self.rest()[32 * self.total :]
            inodes, numbers = array("Q"), array("q")
            inodes.frombytes(body[: 8 * self.total])
            numbers.frombytes(body[8 * self.total :])
            self._arrays = (inodes, numbers)
        return self._arrays

    def close(self) -> None:
        """Close the record file if its second part was never read."""
        source, self._source = self._source, None
        if isinstance(source, tuple):
            os.close(source[0])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # also at interpreter exit
            self.close()


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


def encode(root: str, dev: int, kind: str, dirs: list[DirRecord], hexdigest: str = "") -> bytes:
    """The record as bytes, with the tree's ``hexdigest``."""
    fps = [fingerprint(d.sigs) for d in dirs]
    listings = [d.names if d.entries is None else d.entries for d in dirs]
    header = json.dumps(
        {
            "root": root,
            "dev": dev,
            "kind": kind,
            "hash": hexdigest,
            "dirs": [
                [
                    d.rel,
                    d.dev,
                    len(d.names),
                    len(fp),
                    [[i, s[4]] for i, s in enumerate(d.sigs) if len(s) > 4],
                    len(listing),
                    _others(listing, d.names),
                    d.facts,
                ]
                for d, fp, listing in zip(dirs, fps, listings, strict=True)
            ],
        },
        ensure_ascii=False,
    ).encode("utf-8", "surrogateescape")
    inodes, numbers = array("Q"), array("q")
    for d in dirs:
        for sig in d.sigs:
            inodes.append(sig[0])
            numbers.extend(sig[1:4])
    entries = "\0".join(e for listing in listings for e in listing)
    fast = [header, b"".join(fps), entries.encode("utf-8", "surrogateescape")]
    digests, sigs = b"".join(d.digests for d in dirs), inodes.tobytes() + numbers.tobytes()
    head = b"".join([_MAGIC, _HEAD.pack(*map(len, [*fast, digests, sigs])), *fast])
    rest = digests + sigs
    return head + _CRC.pack(zlib.crc32(head)) + rest + _CRC.pack(zlib.crc32(rest))


def decode(blob: bytes) -> TreeRecord:
    """Parse :func:`encode`'s bytes; raises ``ValueError`` on anything unexpected in
    the first part, RecordError from the digests and signatures when first used."""
    view = memoryview(blob)
    head = _read_head(bytes(view[:_START]))
    end = _START + sum(head[:3]) + _CRC.size
    return _decode_first(view[:end], head, view[end:])


def read_record(fd: int) -> TreeRecord:
    """The record in the open file ``fd``: its first part read now, the rest later
    through ``fd``, which the record then owns (``close()`` it when done)."""
    head = _read_head(os.pread(fd, _START, 0))
    end = _START + sum(head[:3]) + _CRC.size
    if os.fstat(fd).st_size != end + head[3] + head[4] + _CRC.size:
        raise ValueError("stat cache record lengths do not add up")
    return _decode_first(memoryview(os.pread(fd, end, 0)), head, (fd, end))


def _read_head(blob: bytes) -> tuple[int, ...]:
    if len(blob) < _START or not blob.startswith(_MAGIC):
        raise ValueError("not a stat cache record")
    return _HEAD.unpack_from(blob, len(_MAGIC))


def _decode_first(
    view: memoryview, lengths: tuple[int, ...], source: memoryview | tuple[int, int]
) -> TreeRecord:
    end = len(view) - _CRC.size
    if end != _START + sum(lengths[:3]) or end < _START:
        raise ValueError("stat cache record is truncated")
    if zlib.crc32(view[:end]) != _CRC.unpack_from(view, end)[0]:
        raise ValueError("stat cache record checksum mismatch")
    ends = [_START + sum(lengths[: i + 1]) for i in range(3)]
    header = json.loads(bytes(view[_START : ends[0]]).decode("utf-8", "surrogateescape"))
    fps = view[ends[0] : ends[1]]
    raw_entries = bytes(view[ends[1] : ends[2]])
    dirs = header["dirs"]
    total = sum(d[2] for d in dirs)
    if lengths[3] != 32 * total or lengths[4] != 32 * total:
        raise ValueError("stat cache record counts do not add up")
    entries: list[bytes] | list[str] = []
    if sum(d[5] for d in dirs):
        entries = (
            raw_entries.split(b"\0")
            if _BYTES_NAMES
            else raw_entries.decode("utf-8", "surrogateescape").split("\0")
        )
    record = TreeRecord(
        header["root"], header["dev"], header["kind"], {}, str(header.get("hash", "")), total
    )
    at = fp_at = e_at = 0
    for rel, dev, n, fp_len, links, n_entries, others, facts in dirs:
        ordered = sorted(set(others)) == others and all(0 <= i < n_entries for i in others)
        if n + len(others) != n_entries or not ordered:
            raise ValueError("stat cache record counts do not add up")
        record.dirs[rel] = DirView(
            rel,
            dev,
            fps[fp_at : fp_at + fp_len],
            tuple(facts) if facts is not None else None,
            entries[e_at : e_at + n_entries],
            others,
            record,
            at,
            links,
        )
        at, fp_at, e_at = at + n, fp_at + fp_len, e_at + n_entries
    if fp_at != len(fps) or e_at != len(entries):
        raise ValueError("stat cache record counts do not add up")
    record._source = source  # last: a record that failed to parse owns nothing
    return record
