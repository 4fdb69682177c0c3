"""Reading one file of a Data tree for its kinetic digest (stdlib only).

A file's digest is ``sha256(relpath + NUL + bytes)`` (:func:`relpath_bytes` builds
the prefix).  Reading must never hang nor hash other bytes than the walk saw: files
are opened non-blocking (a FIFO swapped in after the walk raises instead of waiting
for a writer), reads are bounded by the size the walk saw, and an ``fstat`` of the
open file confirms a regular file before more than that is read.  Small files are
one read and one hash call; bigger ones stream through a per-thread buffer, with an
``fstat`` before and after to retry a file that changed while it was read.

Every read of file contents goes through :func:`_digest_open` (the walk's
``fresh_dir`` calls it as ``filedigest._digest_open``), so patching it here sees them
all.  The walk itself is ``treewalk.py``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from stat import S_ISREG
from typing import Any

from airflow_provider_kinetic.core.data.hashing.errors import (
    DataPathError,
    _special,
    _unreadable,
)
from airflow_provider_kinetic.core.data.hashing.statcache import Sig
from airflow_provider_kinetic.core.errors import KineticError

log = logging.getLogger(__name__)

#: Non-blocking: opening a FIFO that appeared after the walk must not wait for a writer.
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
#: Read in one call below this size; bigger files stream through a buffer.
SMALL_FILE = 1 << 20
#: Read buffer: small enough to stay in the core's L2 cache while it is hashed, which
#: makes a streamed file hash faster than hashing the same bytes from one big buffer.
_BLOCK = 1 << 20
_RETRIES = 3
#: Files this large are read ahead by a second thread (``_read_pipelined``).
PIPELINE_MIN = 32 << 20
#: Blocks in flight between the reading and the hashing thread.
_BUFFERS = 4
_CORES = os.cpu_count() or 1

_local = threading.local()


def _utf8(label: str, rel: str, name: str) -> bytes:
    """A name as kinetic hashes it (UTF-8); other names cannot be object names."""
    try:
        return name.encode()
    except UnicodeEncodeError:
        raise DataPathError(
            f"Data path {label!r} contains {rel + name!r}, whose name is not valid UTF-8 "
            "(object names must be)"
        ) from None


def relpath_bytes(label: str, rel: str, name: str) -> bytes:
    """``relpath + NUL``, the prefix of a file's digest."""
    return _utf8(label, "", rel) + _utf8(label, rel, name) + b"\0"


def _read_stream(fd: int, h: hashlib._Hash) -> int:
    """Hash ``fd`` from its current offset to EOF into ``h``; returns bytes read.

    A file of ``PIPELINE_MIN`` or more, on a machine with a second core, is read by a
    second thread while this one hashes (both release the GIL): the hash then runs at
    hashlib's in-memory rate instead of paying for every read on top of it.
    """
    if _CORES > 1 and os.fstat(fd).st_size >= PIPELINE_MIN:
        return _read_pipelined(fd, h)
    buf = getattr(_local, "buf", None)
    if buf is None:  # one buffer per thread, reused: no 1 MiB zero-fill per file
        buf = _local.buf = bytearray(_BLOCK)
    view = memoryview(buf)
    total = 0
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
        total += n
    return total


def _read_pipelined(fd: int, h: hashlib._Hash) -> int:
    """``_read_stream`` with the reads in a thread, ``_BUFFERS`` blocks ahead at most."""
    free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    full: queue.SimpleQueue[tuple[Any, int]] = queue.SimpleQueue()
    for _ in range(_BUFFERS):
        free.put(bytearray(_BLOCK))
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                buf = free.get()
                n = os.readv(fd, [buf])
                full.put((buf, n))
                if n == 0:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the hashing thread
            full.put((exc, -1))

    reader = threading.Thread(target=read, name="kinetic-hash-read", daemon=True)
    reader.start()
    total = 0
    try:
        while True:
            buf, n = full.get()
            if n < 0:
                raise buf
            if n == 0:
                return total
            h.update(memoryview(buf)[:n])
            total += n
            free.put(buf)
    finally:
        stop.set()
        free.put(bytearray(0))  # wakes a reader waiting for a buffer; it then stops
        reader.join()


def file_digest(
    name: str,
    relb: bytes,
    sig: Sig,
    label: str,
    dir_fd: int | None = None,
    verify: bool = True,
    where: str | None = None,
) -> tuple[bytes, bool]:
    """kinetic's digest of one file (``name`` relative to ``dir_fd``, or a path).

    ``stable`` says the bytes read are those of the file the walk saw (``sig``):
    only then may the digest be cached under ``sig``.  ``verify=False`` (nothing will
    be cached) skips the ``fstat`` that proves it for small files.
    """
    where = where or name
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _unreadable(label, where, exc) from exc
    try:
        if not verify and sig[1] < SMALL_FILE:
            data = os.read(fd, sig[1] + 1)
            if len(data) == sig[1]:
                return hashlib.sha256(relb + data).digest(), False
            os.lseek(fd, 0, os.SEEK_SET)
        st = os.fstat(fd)
        digest, stable = _digest_open(fd, relb, st, label, where)
        return digest, stable and (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == sig[:4]
    except BlockingIOError:  # a FIFO swapped in after the walk
        raise _special(label, where, os.fstat(fd).st_mode) from None
    except OSError as exc:
        if isinstance(exc, KineticError):
            raise
        raise _unreadable(label, where, exc) from exc
    finally:
        os.close(fd)


def _digest_open(
    fd: int, relb: bytes, st: os.stat_result, label: str, where: str
) -> tuple[bytes, bool]:
    """Digest of the open file ``fd`` (at offset 0) whose ``fstat`` before reading is
    ``st``.  ``stable``: what was read is the file ``st`` describes.  Non-regular files
    raise (never read: reads are bounded by the size and ``fd`` is non-blocking)."""
    if not S_ISREG(st.st_mode):
        raise _special(label, where, st.st_mode)
    size = st.st_size
    try:
        if size < SMALL_FILE:  # the common case: one read, one hash call
            data = os.read(fd, size + 1)
            if len(data) == size:
                return hashlib.sha256(relb + data).digest(), True
        before = st
        h = hashlib.sha256()
        for _ in range(_RETRIES):  # stream, with fstat before and after
            os.lseek(fd, 0, os.SEEK_SET)
            h = hashlib.sha256(relb)
            _read_stream(fd, h)
            after = os.fstat(fd)
            facts = (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns)
            if facts == (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns):
                return h.digest(), facts[1:] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            before = after
        log.warning("Data path %r: %s kept changing while it was hashed", label, where)
        return h.digest(), False
    except BlockingIOError:  # a FIFO swapped in after the walk
        raise _special(label, where, os.fstat(fd).st_mode) from None
