"""The object-store contract shared by the GCS and local (``file://``) stores.

Keys are ``/``-separated object names relative to the store's bucket (or root
directory).  Every higher layer (data cache, payload upload, runner, batches)
speaks only this interface, so the local backend is an honest rehearsal of GCS.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterable

from airflow_provider_kinetic.core.errors import KineticError

#: Called with (files_done, files_total, bytes_done) as a transfer progresses.
ProgressFn = Callable[[int, int, int], None]


class ObjectNotFound(KineticError, FileNotFoundError):
    """Raised when a key does not exist in the store."""


class PreconditionFailed(KineticError, FileExistsError):
    """Raised by ``write_bytes(..., if_absent=True)`` when the key already exists."""


class OutsideStoreError(KineticError, PermissionError):
    """A read of a key whose path leads out of the store's root through a symlink (a
    job's output dir may hold any link its function left there).  Reads resolve links
    and serve only what lies inside the root; this error names the key and the store
    and is never retried: the object stays refused until the link is removed."""


class StoreUnavailable(KineticError, OSError):
    """The store cannot be read right now (a local mount that went away, a root that is
    missing or unreadable, a job whose state is hidden while it runs): a transient
    error.  Polls retry it for ``[kinetic] store_outage_window_s`` instead of reporting
    a job NOT_FOUND, which would fail the task and leave the job running unwatched."""


class StoreFullError(KineticError, OSError):
    """A write failed for lack of space or quota (``ENOSPC``/``EDQUOT``); the message
    names the key, the path, the size being written and the free space where known,
    because a bare ``[Errno 28]`` says none of that."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class FileDigests:
    """Digests of downloaded files, taken from the bytes as they arrived, so a caller
    that must hash what it downloaded (a data-cache entry's content hash) need not
    read it all again.

    ``prefix(rel)`` says what each file's digest starts with (``None``: not hashed);
    a digest is ``sha256(prefix + bytes)``, kept by the file's local path with the
    ``(inode, size, mtime_ns, ctime_ns)`` it had when its last byte was written: :meth:`lookup`
    answers only for that same file, unchanged, and the same prefix, so a file that
    was replaced or touched since is read again.  Only bytes that passed the store's
    own checks (size, CRC32C) are recorded."""

    def __init__(self, prefix: Callable[[str], bytes | None]) -> None:
        self.prefix = prefix
        self.found: dict[str, tuple[bytes, bytes, tuple[int, int, int, int]]] = {}

    def record(self, path: str, prefix: bytes, digest: bytes, st: os.stat_result) -> None:
        self.found[path] = (prefix, digest, (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))

    def lookup(self, path: str, prefix: bytes, sig: tuple[int, ...]) -> bytes | None:
        """The digest of ``path`` if recorded with ``prefix`` for the file whose
        ``lstat`` signature (``ino, size, mtime_ns, ctime_ns, ...``) is ``sig``, else None."""
        got = self.found.get(path)
        if got is None or got[0] != prefix or got[2] != tuple(sig[:4]):
            return None
        return got[1]


class ObjectStore(abc.ABC):
    """A flat namespace of objects: a GCS bucket or a local directory."""

    #: URI scheme: "gs" or "file".
    scheme: str
    #: Bucket name (GCS) or absolute root directory (local).
    bucket: str
    #: How local Data is stored (``core/data/refs.py``: ``files`` incremental, or
    #: ``kinetic`` per tree); set from the connection's ``data_layout``.
    data_layout: str = "files"

    @abc.abstractmethod
    def uri(self, key: str = "") -> str:
        """Full URI of ``key`` (``gs://bucket/key`` or ``file:///root/key``)."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the object ``key`` exists."""

    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """Content of ``key``; raises ``ObjectNotFound`` when absent."""

    @abc.abstractmethod
    def write_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None = None,
        if_absent: bool = False,
    ) -> None:
        """Write ``data`` atomically (readers never see a partial object).

        ``if_absent=True`` raises ``PreconditionFailed`` when the key exists.
        """

    @abc.abstractmethod
    def upload_file(self, local_path: str, key: str) -> int:
        """Upload one local file; returns its size in bytes."""

    @abc.abstractmethod
    def upload_files(
        self,
        root: str,
        relpaths: Iterable[str],
        prefix: str,
        progress: ProgressFn | None = None,
        digests: FileDigests | None = None,
    ) -> int:
        """Upload ``root/rel`` to ``prefix/rel`` for each rel, in parallel.

        Returns the number of bytes uploaded; raises on the first failure.
        ``progress`` ends with ``(n, n, total_bytes)`` (``(0, 0, 0)`` for no files).
        ``digests``: where a store can, each file's digest (``prefix(rel)``) taken
        from the very bytes it sent, recorded by the file's local path (a store may
        record none for some files; the caller then reads them again).
        """

    @abc.abstractmethod
    def download_file(self, key: str, local_path: str, size: int | None = None) -> None:
        """Download one object to ``local_path`` (parents created).  ``size``: the
        object's listed size, when the caller knows it (a store may then read a small
        object in one piece)."""

    @abc.abstractmethod
    def download_prefix(
        self,
        prefix: str,
        local_dir: str,
        progress: ProgressFn | None = None,
        digests: FileDigests | None = None,
    ) -> list[str]:
        """Download every object under ``prefix/`` into ``local_dir``.

        Relative paths are preserved; returns the relative paths written (sorted).
        ``prefix`` has directory semantics: ``"a/b"`` and ``"a/b/"`` both mean the
        objects under ``a/b/`` (never ``a/bc``).  Object names ending in ``/`` are
        skipped; a name that would escape ``local_dir`` raises ``ValueError``.
        ``digests``: where a store can, the files' digests as they arrive (a store
        may record none; the caller then reads the files).
        """

    def workers_for(self, count: int, total_bytes: int) -> int:
        """Threads for a caller's own many-object transfer (``download_file`` per
        object, e.g. a broadcast's store read, which must see each file as it
        lands), with the store's client made ready for that many at once."""
        return max(1, min(count, 8))

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix`` (sorted)."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Delete the one object ``key``; whether it existed."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many were deleted.

        Directory semantics as ``download_prefix``: ``"a/b"`` deletes ``a/b/...`` but
        not ``a/bc``.  An empty prefix raises ``ValueError`` (it would empty the
        bucket, or for ``LocalStore("/")`` the filesystem).
        """
