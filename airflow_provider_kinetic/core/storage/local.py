"""``LocalStore``: the ``file://`` object store, a directory standing in for a bucket.

It exists so that the local backend rehearses exactly what a GKE job does with GCS:
same keys, same atomicity (readers never see a partial object: every write goes to a
temporary file that is then renamed into place), and the same ``if_absent``
semantics (a hard link, which fails atomically when the name exists, so two racing
writers cannot both win).  Stdlib only.

Temporary files live in one staging directory under the root (``.kinetic-tmp/``),
never inside the directory being written: a writer killed mid-upload must not leave
debris inside a data-cache entry, which the local backend serves to jobs as it is.
Each temporary name carries its writer's pid, so the next upload removes the files
of writers that are gone.  A write that runs out of space or quota removes its temp
file and raises ``StoreFullError`` naming the key, the path, the size and the room
left (``full_error``).
Reads never leave the root (``local_confine``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from typing import BinaryIO

from airflow_provider_kinetic.core.storage import local_confine, local_disk
from airflow_provider_kinetic.core.storage._keys import (
    dir_prefix,
    join_key,
    materialise,
    safe_relpath,
)
from airflow_provider_kinetic.core.storage._parallel import run_parallel
from airflow_provider_kinetic.core.storage.base import (
    FileDigests,
    ObjectStore,
    PreconditionFailed,
    ProgressFn,
    StoreFullError,
)
from airflow_provider_kinetic.core.storage.fileuri import file_uri, file_uri_path

#: Suffix of in-flight temporary files; ``list`` and ``download_prefix`` skip them.
TMP_SUFFIX = ".kinetic-tmp"
#: The staging directory under the root (its name ends with the suffix: unlisted).
STAGING_DIR = TMP_SUFFIX
#: Staged files older than this are removed even when their pid is alive (reused pid).
STALE_S = 24 * 3600.0


#: Writes in flight per staging directory in this process: the last one out removes
#: the (then empty) directory, so a store root is left as tidy as it was found.
_IN_FLIGHT: dict[str, int] = {}
_IN_FLIGHT_LOCK = threading.Lock()


#: Tries to create a temp file in the staging dir: each writer removes the dir when it
#: has nothing in flight, so with many processes writing (tries, history, records) the
#: dir can go between our ``makedirs`` and ``open`` more than once in a row.
_STAGING_ATTEMPTS = 50


class LocalStore(ObjectStore):
    """Objects are files under ``root``; a key ``a/b/c`` is the file ``root/a/b/c``."""

    scheme = "file"

    def __init__(self, root: str, workers: int = 8) -> None:
        # A file:// URI names its path (else abspath would make a "file:" dir here).
        self.bucket = os.path.abspath(file_uri_path(root) if root.startswith("file:") else root)
        self.workers = max(1, workers)

    def __repr__(self) -> str:
        return f"LocalStore({self.bucket!r})"

    # -- paths ---------------------------------------------------------------------

    def _path(self, key: str) -> str:
        """Filesystem path of ``key``; refuses keys that would escape the root."""
        path = os.path.normpath(os.path.join(self.bucket, *key.split("/")))
        root = self.bucket
        if path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
            raise ValueError(f"key {key!r} escapes the store root {root!r}")
        return path

    def _read_path(self, key: str) -> str:
        return local_confine.read_path(self.bucket, self._path(key), key, self.uri(key))

    def _open_read(self, key: str) -> BinaryIO:
        return local_confine.open_read(self.bucket, self._path(key), key, self.uri(key))

    def stat(self, key: str) -> os.stat_result:
        """The stat of the file ``key`` is (or links to, inside the root)."""
        return local_confine.stat_file(self.bucket, self._path(key), key, self.uri(key))

    def uri(self, key: str = "") -> str:
        """``file://`` + the object's path, percent-encoded (``fileuri.py``)."""
        return file_uri(self._path(key) if key else self.bucket)

    # -- single objects ------------------------------------------------------------

    def exists(self, key: str) -> bool:
        """Whether ``key`` is a file (or a link to one inside the root); a key that
        leads outside raises ``OutsideStoreError`` rather than answer either way."""
        return os.path.isfile(self._read_path(key))

    def read_bytes(self, key: str) -> bytes:
        with self._open_read(key) as f:
            return f.read()

    def make_private(self, key: str) -> None:
        """Owner-only access (0600) for an object holding job data (payload, handle)."""
        os.chmod(self._path(key), 0o600)

    def write_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None = None,
        if_absent: bool = False,
    ) -> None:
        """Atomic write; ``content_type`` is accepted for parity with GCS and ignored."""
        self._commit(key, lambda f: f.write(data), if_absent=if_absent, size=len(data))

    def upload_file(self, local_path: str, key: str) -> int:
        return self._upload_hashed(local_path, key, None, None)

    def _upload_hashed(
        self, local_path: str, key: str, prefix: bytes | None, digests: FileDigests | None
    ) -> int:
        """Copy ``local_path`` to ``key``; with ``digests``, the bytes copied are
        hashed on the way (``sha256(prefix + bytes)``) and recorded.  Each fill starts
        from the file's start (``_write`` fills again beside the target on EXDEV)."""
        hasher = [hashlib.sha256()]
        with open(local_path, "rb") as src:
            size = os.fstat(src.fileno()).st_size

            def fill(dst: BinaryIO) -> None:
                src.seek(0)
                hasher[0] = hashlib.sha256(prefix or b"")
                reader = local_disk.Hashing(src, hasher[0] if prefix is not None else None)
                shutil.copyfileobj(reader, dst, 1024 * 1024)

            self._commit(key, fill, size=size)
            if digests is not None and prefix is not None:
                digests.record(local_path, prefix, hasher[0].digest(), os.fstat(src.fileno()))
        return size

    def delete(self, key: str) -> bool:
        try:
            os.unlink(self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        return True

    def download_file(self, key: str, local_path: str, size: int | None = None) -> None:
        with self._open_read(key) as src:
            parent = os.path.dirname(os.path.abspath(local_path))
            os.makedirs(parent, exist_ok=True)
            tmp = os.path.join(parent, f".{secrets.token_hex(8)}{TMP_SUFFIX}")
            try:
                with open(tmp, "wb") as dst:
                    local_disk.copy_open(src, dst)
                os.replace(tmp, local_path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _copy_out(self, key: str, local_path: str) -> None:
        """``key`` copied to ``local_path`` in place (``download_prefix``'s copy)."""
        with self._open_read(key) as src, open(local_path, "wb") as dst:
            local_disk.copy_open(src, dst)

    def _staging(self) -> str | None:
        """The staging directory, or ``None`` for ``LocalStore("/")`` (a view of the
        whole file system for ``file://`` URIs: no directory of its own to write in)."""
        return None if self.bucket == os.sep else os.path.join(self.bucket, STAGING_DIR)

    def sweep_staging(self) -> int:
        """Remove staged files whose writer is gone; returns how many were removed."""
        staging = self._staging()
        if staging is None:
            return 0
        try:
            entries = list(os.scandir(staging))
        except OSError:
            return 0
        removed, now = 0, time.time()
        for entry in entries:
            pid, _, _ = entry.name.partition("-")
            try:
                stale = not pid.isdigit() or not local_disk.writer_alive(int(pid))
                if stale or now - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue  # gone already, or not ours to remove
        return removed

    def _commit(
        self,
        key: str,
        fill: Callable[[BinaryIO], object],
        *,
        if_absent: bool = False,
        size: int | None = None,
    ) -> None:
        """``_write``, with a full disk or quota (``ENOSPC``/``EDQUOT``) reported as a
        ``StoreFullError`` naming the key, the path, the size and the free space left
        once the partial temp file is gone (a bare ``[Errno 28]`` names none of them)."""
        try:
            self._write(key, fill, if_absent=if_absent)
        except StoreFullError:
            raise
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise local_disk.full_error(self.uri(key), self._path(key), size, exc) from exc

    def _write(
        self, key: str, fill: Callable[[BinaryIO], object], *, if_absent: bool = False
    ) -> None:
        """Write via ``fill`` into a staged temp file, then publish it under ``key``.

        Publishing is ``os.replace`` (atomic overwrite) or, for ``if_absent``,
        ``os.link`` (atomic create-if-missing).  Where hard links are unsupported we
        fall back to claiming the name with ``O_EXCL`` and then replacing it, which is
        still race-free between writers but may briefly show readers an empty file.
        The temp file is created with mode 0o666 so the umask applies as for any other
        file (``mkstemp`` would leave published objects 0o600).  No fsync: the
        contract is reader atomicity, not durability across power loss.  When the
        staging directory is on another file system than the target (a mount inside
        the root), the temp file goes beside the target instead.
        """
        final = self._path(key)
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        staging = self._staging()
        if staging is not None:
            with _IN_FLIGHT_LOCK:
                _IN_FLIGHT[staging] = _IN_FLIGHT.get(staging, 0) + 1
            try:
                self._publish(final, staging, fill, if_absent=if_absent, key=key)
                return
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            finally:
                with _IN_FLIGHT_LOCK:
                    _IN_FLIGHT[staging] -= 1
                    if not _IN_FLIGHT[staging]:
                        del _IN_FLIGHT[staging]
                        with contextlib.suppress(OSError):  # in use by another process
                            os.rmdir(staging)
        self._publish(final, parent, fill, if_absent=if_absent, key=key)

    def _publish(
        self,
        final: str,
        tmp_dir: str,
        fill: Callable[[BinaryIO], object],
        *,
        if_absent: bool,
        key: str,
    ) -> None:
        tmp = os.path.join(tmp_dir, f"{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}")
        for attempt in range(_STAGING_ATTEMPTS):
            try:
                fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
                break
            except FileNotFoundError:  # no staging dir yet, or another process removed it
                if attempt == _STAGING_ATTEMPTS - 1:
                    raise
                # Not exist_ok: that re-checks isdir, which races with a writer's rmdir.
                with contextlib.suppress(FileExistsError):
                    os.makedirs(tmp_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                fill(out)
            if not if_absent:
                os.replace(tmp, final)
                return
            try:
                os.link(tmp, final)
            except FileExistsError as e:
                raise PreconditionFailed(self.uri(key)) from e
            except OSError as e:
                if e.errno == errno.EXDEV:
                    raise
                try:  # no hard links on this filesystem
                    os.close(os.open(final, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError as e2:
                    raise PreconditionFailed(self.uri(key)) from e2
                os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # -- many objects --------------------------------------------------------------

    def upload_files(
        self,
        root: str,
        relpaths: Iterable[str],
        prefix: str,
        progress: ProgressFn | None = None,
        digests: FileDigests | None = None,
    ) -> int:
        """Copy each file (through ``upload_file``) on a thread pool; first sweeps the
        temp files of writers that were killed.  ``digests``: every file's digest,
        from the bytes copied."""
        jobs = []
        rel_of: dict[str, str] = {}
        for rel in materialise(relpaths):
            src = os.path.join(root, *rel.split("/"))
            jobs.append((src, join_key(prefix, rel), os.path.getsize(src)))
            rel_of[src] = rel
        self.sweep_staging()
        if digests is None:
            return run_parallel(jobs, self.upload_file, self.workers, progress)

        def copy(src: str, key: str) -> int:
            return self._upload_hashed(src, key, digests.prefix(rel_of[src]), digests)

        return run_parallel(jobs, copy, self.workers, progress)

    def workers_for(self, count: int, total_bytes: int) -> int:
        """The store's own copy pool size (a disk, not a network: no latency to hide)."""
        return max(1, min(count, self.workers))

    def download_prefix(
        self,
        prefix: str,
        local_dir: str,
        progress: ProgressFn | None = None,
        digests: FileDigests | None = None,
    ) -> list[str]:
        """Copy every file under ``prefix/`` (directory semantics) into ``local_dir``
        (``digests``: none recorded, the copies are made by the kernel)."""
        base = dir_prefix(prefix)
        rels, jobs = [], []
        for key in self.list(base):
            rel = key[len(base) :]
            dst = os.path.join(local_dir, *safe_relpath(rel).split("/"))
            rels.append(rel)
            jobs.append((key, dst, self.stat(key).st_size))
        for parent in {os.path.dirname(dst) for _, dst, _ in jobs}:
            os.makedirs(parent, exist_ok=True)
        run_parallel(jobs, self._copy_out, self.workers, progress)
        return rels

    def list(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix`` (``local_confine.list_keys``: never through a
        link out of the root); in-flight temporary files are left out."""
        self._path(prefix.rsplit("/", 1)[0] if "/" in prefix else "")  # inside the root
        return local_confine.list_keys(self.bucket, prefix, TMP_SUFFIX)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix/`` (directory semantics, never ``""``).

        Emptied directories are removed too, so a later ``list`` of the parent does
        not trip over them, and so are the links ``list`` leaves out (to directories,
        or out of the root): the links themselves, never what they point to.  An
        empty prefix is refused: for ``LocalStore("/")`` it would mean the whole
        filesystem.
        """
        base = dir_prefix(prefix)
        if not base:
            raise ValueError("delete_prefix needs a non-empty prefix")
        top = self._path(base.rstrip("/"))
        ours = local_confine.inside(os.path.realpath(top), os.path.realpath(self.bucket))
        if ours and os.path.isdir(top) and not os.path.islink(top):
            # A data-cache entry's directories are read-only: writable again to be emptied.
            for dirpath, _, _ in os.walk(top):
                with contextlib.suppress(OSError):
                    if not os.access(dirpath, os.W_OK):
                        os.chmod(dirpath, 0o755)
        count = 0
        for key in self.list(base):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))
                count += 1
        if not ours:
            return count  # a link out of the root: its target's directories are not ours
        for dirpath, dirs, files in os.walk(top, topdown=False):
            for name in dirs + files:  # what is left: links not listed, temp files
                link = os.path.join(dirpath, name)
                if os.path.islink(link):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(link)
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)  # only succeeds when empty
        return count
