"""Walking a Data tree for its content hash (stdlib only).

Kinetic's order: ``os.walk`` top-down without following directory symlinks, each
directory's files sorted and hashed before its sorted subdirectories.  Symlinked files
count with their target's bytes.  A symlinked directory or a dangling link inside the
tree (kinetic does not descend into the one and cannot read the other), and a FIFO,
socket or device inside the tree or as the path itself, are errors naming the entry
and the Data path (the rule: ``errors.py``), raised while hashing (so before anything
is uploaded), never a hang (how files are read safely: ``filedigest.py``).

Each directory is listed once and each entry stat-ed once, relative to an open
directory descriptor (no ``relpath``/``abspath`` per file): on a stat cache check
that loop (:func:`stat_dir`) is all the work there is, so it records regular files
only and leaves the rare other entries to :func:`_sort_out`.  A first hash
(:func:`fresh_dir`) takes entry types from the listing and each file's facts from the
``fstat`` of the descriptor it reads, one system call fewer per file.

The error types (``errors.py``) and the file digest (``filedigest.py``) live below
this module; it re-exports the names callers import from here.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from stat import S_ISDIR, S_ISLNK, S_ISREG
from typing import Any

from airflow_provider_kinetic.core.data.hashing import filedigest
from airflow_provider_kinetic.core.data.hashing.errors import (
    DataPathError,
    DataReadError,
    _dangling,
    _linked_dir,
    _special,
    _unreadable,
)
from airflow_provider_kinetic.core.data.hashing.filedigest import (
    _FILE_FLAGS,
    _utf8,
    file_digest,
    relpath_bytes,
)
from airflow_provider_kinetic.core.data.hashing.statcache import Sig
from airflow_provider_kinetic.core.errors import KineticError

__all__ = [
    "DataPathError",
    "DataReadError",
    "DirScan",
    "Facts",
    "FreshDir",
    "dir_facts",
    "file_digest",
    "fresh_dir",
    "open_dir",
    "relpath_bytes",
    "scan_tree",
    "stat_dir",
    "walk",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
#: A link whose target cannot be reached: missing, a loop, a file used as a directory.
_DANGLING = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)
_REG, _FMT = 0o100000, 0o170000


#: A directory's own facts, ``(st_dev, st_ino, mtime_ns, ctime_ns)``: while they are
#: unchanged (and were not racy), so is its listing (any entry created, removed or
#: renamed moves its mtime and ctime).
Facts = tuple[int, int, int, int]


def dir_facts(st: os.stat_result) -> Facts:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _lazy(slot: str) -> Any:
    """A ``DirScan`` attribute that may be given as a function, called on first read."""

    def get(self: DirScan) -> Any:
        if callable(value := getattr(self, slot)):
            setattr(self, slot, value := value())
        return value

    return property(get)


class DirScan:
    """One directory as walked now: its files (sorted) and their stat signatures, its
    whole sorted listing and its own facts (``None`` when unknown).  ``names``, ``sigs``
    and ``entries`` may be functions, called on first read (a directory found equal to
    its stat cache record takes them from the record only if they are asked for)."""

    __slots__ = ("_entries", "_names", "_sigs", "dev", "facts", "rel")
    names: list[str] = _lazy("_names")
    sigs: list[Sig] = _lazy("_sigs")
    entries: list[str] = _lazy("_entries")

    def __init__(
        self, rel: str, dev: int, names: Any, sigs: Any, entries: Any, facts: Facts | None = None
    ) -> None:
        self.rel, self.dev, self.facts = rel, dev, facts  # rel: "" for the root, else "a/b/"
        self._names, self._sigs, self._entries = names, sigs, entries

    @property
    def empty(self) -> bool:
        """The directory has no entry at all, known without reading a lazy listing: a
        listing given as a function is never an empty one (an empty one is ``[]``)."""
        return not callable(self._entries) and not self._entries


def open_dir(path: str, rel: str, label: str) -> int:
    """An open descriptor of a directory of the tree (the root may be a symlink to a
    directory, followed as ``os.walk`` does; below it, symlinks are never followed)."""
    try:
        return os.open(path, _DIR_FLAGS | (os.O_NOFOLLOW if rel else 0))
    except OSError as exc:
        raise _unreadable(label, path, exc) from exc


def stat_dir(
    fd: int,
    path: str,
    rel: str,
    label: str,
    facts: Facts | None = None,
    entries: list[str] | None = None,
) -> tuple[DirScan, list[tuple[str, Facts]]]:
    """One directory's files and their stat signatures (one ``lstat`` per entry), and
    its subdirectories with their facts (a stat cache check where the fast one cannot
    vouch).  ``entries``: its sorted listing when known to be unchanged (not re-read)."""
    lstat, fmt, reg = os.lstat, _FMT, _REG
    subdirs: list[tuple[str, Facts]] = []
    try:
        dev = os.fstat(fd).st_dev
        if entries is None:
            entries = os.listdir(fd)
            entries.sort()
        names = entries
        sigs: list[Sig] = []
        add = sigs.append
        odd: list[tuple[int, os.stat_result]] = []
        for name in entries:
            st = lstat(name, dir_fd=fd)
            if st.st_mode & fmt == reg:
                add((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            else:
                odd.append((len(sigs) + len(odd), st))
        if odd:
            names, sigs = _sort_out(label, path, fd, entries, sigs, odd, subdirs)
    except OSError as exc:
        if isinstance(exc, KineticError):
            raise
        raise _unreadable(label, path, exc) from exc
    return DirScan(rel, dev, names, sigs, entries, facts), subdirs


def walk(root: str, label: str) -> Iterator[tuple[DirScan, int]]:
    """Yield each directory of ``root`` in kinetic's order with an open descriptor of
    it (valid until the next iteration); raises on special files.  ``label`` is the
    Data path as the user wrote it, for error messages."""
    stack: list[tuple[str, str, Facts | None]] = [("", root, None)]
    while stack:
        rel, path, facts = stack.pop()
        fd = open_dir(path, rel, label)
        try:
            scan, subdirs = stat_dir(fd, path, rel, label, facts)
            yield scan, fd
        finally:
            os.close(fd)
        for name, sub_facts in reversed(subdirs):
            stack.append((f"{rel}{name}/", os.path.join(path, name), sub_facts))


def scan_tree(root: str, label: str) -> list[DirScan]:
    """Every directory of ``root`` (see :func:`walk`), without reading a file."""
    return [scan for scan, _ in walk(root, label)]


@dataclass
class FreshDir:
    """A directory hashed with nothing cached: ``digests[j]`` is None for the files
    left to the caller (``big``: at least ``big_size`` bytes, or symlinked)."""

    scan: DirScan
    digests: list[bytes | None]
    unstable: list[int]
    big: list[int]
    subdirs: list[tuple[str, Facts]]


def fresh_dir(
    fd: int, path: str, rel: str, label: str, big_size: int, facts: Facts | None = None
) -> FreshDir:
    """List and hash one directory in one go, for a first hash: entry types from the
    listing itself (no ``lstat``), and each small file's signature from the ``fstat``
    of the descriptor it is read through, taken before reading."""
    try:
        dev = os.fstat(fd).st_dev
        with os.scandir(fd) as it:
            entries = sorted(it, key=_entry_name)
    except OSError as exc:
        raise _unreadable(label, path, exc) from exc
    listing = [entry.name for entry in entries]
    out = FreshDir(DirScan(rel, dev, [], [], listing, facts), [], [], [], [])
    names, sigs, digests = out.scan.names, out.scan.sigs, out.digests
    prefix = rel.encode("utf-8", "surrogateescape")
    for entry in entries:
        name = entry.name
        if entry.is_file(follow_symlinks=False):
            where = os.path.join(path, name)
            try:
                file_fd = os.open(name, _FILE_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _unreadable(label, where, exc) from exc
            try:
                st = os.fstat(file_fd)
                sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                names.append(name)
                sigs.append(sig)
                if st.st_size >= big_size:
                    out.big.append(len(digests))
                    digests.append(None)
                    continue
                relb = prefix + _utf8(label, rel, name) + b"\0"
                # Looked up on the module: a patch of filedigest._digest_open sees every read.
                digest, stable = filedigest._digest_open(file_fd, relb, st, label, where)
            finally:
                os.close(file_fd)
            if not stable:
                out.unstable.append(len(digests))
            digests.append(digest)
        elif entry.is_dir(follow_symlinks=False):
            try:
                out.subdirs.append((name, dir_facts(entry.stat(follow_symlinks=False))))
            except OSError as exc:
                raise _unreadable(label, os.path.join(path, name), exc) from exc
        else:  # symlinks and anything special: the stat walk's rules
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                raise _unreadable(label, os.path.join(path, name), exc) from exc
            files, fsigs = _sort_out(label, path, fd, [name], [], [(0, st)], out.subdirs)
            for name, sig in zip(files, fsigs, strict=True):
                names.append(name)
                sigs.append(sig)
                out.big.append(len(digests))
                digests.append(None)
    return out


def _entry_name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _sort_out(
    label: str,
    path: str,
    fd: int,
    names: list[str],
    sigs: list[Sig],
    odd: list[tuple[int, os.stat_result]],
    subdirs: list[tuple[str, Facts]],
) -> tuple[list[str], list[Sig]]:
    """Files and their signatures of one directory, given the entries the scan loop
    set aside (``odd``: name index and ``lstat``): directories go to ``subdirs``,
    symlinked files join the files with their target's facts; a symlinked directory,
    a dangling (or looping) link and anything else raise, naming the entry.
    """
    files: list[str] = []
    fsigs: list[Sig] = []
    last = done = 0
    for idx, st in odd:
        files.extend(names[last:idx])
        fsigs.extend(sigs[done : done + idx - last])
        done += idx - last
        last = idx + 1
        name = names[idx]
        if S_ISDIR(st.st_mode):
            subdirs.append((name, dir_facts(st)))
            continue
        if not S_ISLNK(st.st_mode):
            raise _special(label, os.path.join(path, name), st.st_mode)
        where = os.path.join(path, name)
        try:
            target = os.stat(name, dir_fd=fd)
        except OSError as exc:
            if exc.errno in _DANGLING:
                raise _dangling(label, where, exc) from None
            raise _unreadable(label, where, exc) from exc
        if S_ISREG(target.st_mode):
            files.append(name)
            fsigs.append(
                (
                    target.st_ino,
                    target.st_size,
                    target.st_mtime_ns,
                    target.st_ctime_ns,
                    target.st_dev,
                )
            )
        elif S_ISDIR(target.st_mode):  # kinetic does not descend: refused, not skipped
            raise _linked_dir(label, where)
        else:
            raise _special(label, where, target.st_mode)
    files.extend(names[last:])
    fsigs.extend(sigs[done:])
    return files, fsigs
