"""The object-store contract shared by the GCS and local (``file://``) stores.

Keys are ``/``-separated object names relative to the store's bucket (or root
directory).  Every higher layer (data cache, payload upload, runner, batches)
speaks only this interface, so the local backend is an honest rehearsal of GCS.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable

from airflow_provider_kinetic.core.errors import KineticError

#: Called with (files_done, files_total, bytes_done) as a transfer progresses.
ProgressFn = Callable[[int, int, int], None]


class ObjectNotFound(KineticError, FileNotFoundError):
    """Raised when a key does not exist in the store."""


class PreconditionFailed(KineticError, FileExistsError):
    """Raised by ``write_bytes(..., if_absent=True)`` when the key already exists."""


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


class ObjectStore(abc.ABC):
    """A flat namespace of objects: a GCS bucket or a local directory."""

    #: URI scheme: "gs" or "file".
    scheme: str
    #: Bucket name (GCS) or absolute root directory (local).
    bucket: str

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
    ) -> int:
        """Upload ``root/rel`` to ``prefix/rel`` for each rel, in parallel.

        Returns the number of bytes uploaded; raises on the first failure.
        ``progress`` ends with ``(n, n, total_bytes)`` (``(0, 0, 0)`` for no files).
        """

    @abc.abstractmethod
    def download_file(self, key: str, local_path: str) -> None:
        """Download one object to ``local_path`` (parents created)."""

    @abc.abstractmethod
    def download_prefix(
        self, prefix: str, local_dir: str, progress: ProgressFn | None = None
    ) -> list[str]:
        """Download every object under ``prefix/`` into ``local_dir``.

        Relative paths are preserved; returns the relative paths written (sorted).
        ``prefix`` has directory semantics: ``"a/b"`` and ``"a/b/"`` both mean the
        objects under ``a/b/`` (never ``a/bc``).  Object names ending in ``/`` are
        skipped; a name that would escape ``local_dir`` raises ``ValueError``.
        """

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
