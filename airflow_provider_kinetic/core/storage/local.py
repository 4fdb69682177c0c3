"""``LocalStore``: the ``file://`` object store, a directory standing in for a bucket.

It exists so that the local backend rehearses exactly what a GKE job does with GCS:
same keys, same atomicity (readers never see a partial object, because every write
goes to a temporary file in the target directory and is then renamed into place),
and the same ``if_absent`` semantics (a hard link, which fails atomically when the
name exists, so two racing writers cannot both win).  Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import BinaryIO

from airflow_provider_kinetic.core.storage._keys import (
    dir_prefix,
    join_key,
    materialise,
    safe_relpath,
)
from airflow_provider_kinetic.core.storage.base import (
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    ProgressFn,
)

#: Suffix of in-flight temporary files; ``list`` and ``download_prefix`` skip them.
TMP_SUFFIX = ".kinetic-tmp"


class LocalStore(ObjectStore):
    """Objects are files under ``root``; a key ``a/b/c`` is the file ``root/a/b/c``."""

    scheme = "file"

    def __init__(self, root: str, workers: int = 8) -> None:
        self.bucket = os.path.abspath(root)
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

    def uri(self, key: str = "") -> str:
        return "file://" + (self._path(key) if key else self.bucket)

    # -- single objects ------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def read_bytes(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFound(self.uri(key)) from e

    def write_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None = None,
        if_absent: bool = False,
    ) -> None:
        """Atomic write; ``content_type`` is accepted for parity with GCS and ignored."""
        self._commit(key, lambda f: f.write(data), if_absent=if_absent)

    def upload_file(self, local_path: str, key: str) -> int:
        size = os.path.getsize(local_path)
        with open(local_path, "rb") as src:
            self._commit(key, lambda dst: shutil.copyfileobj(src, dst, 1024 * 1024))
        return size

    def download_file(self, key: str, local_path: str) -> None:
        src = self._path(key)
        if not os.path.isfile(src):
            raise ObjectNotFound(self.uri(key))
        parent = os.path.dirname(os.path.abspath(local_path))
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{secrets.token_hex(8)}{TMP_SUFFIX}")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, local_path)
        except FileNotFoundError as e:  # deleted between the check and the copy
            raise ObjectNotFound(self.uri(key)) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _commit(
        self, key: str, fill: Callable[[BinaryIO], object], *, if_absent: bool = False
    ) -> None:
        """Write via ``fill`` into a temp file beside the target, then publish it.

        Publishing is ``os.replace`` (atomic overwrite) or, for ``if_absent``,
        ``os.link`` (atomic create-if-missing).  Where hard links are unsupported we
        fall back to claiming the name with ``O_EXCL`` and then replacing it, which is
        still race-free between writers but may briefly show readers an empty file.
        The temp file is created with mode 0o666 so the umask applies as for any other
        file (``mkstemp`` would leave published objects 0o600).  No fsync: the
        contract is reader atomicity, not durability across power loss.
        """
        final = self._path(key)
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{os.path.basename(final)}.{secrets.token_hex(8)}{TMP_SUFFIX}")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
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
            except OSError:  # no hard links on this filesystem
                try:
                    os.close(os.open(final, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError as e:
                    raise PreconditionFailed(self.uri(key)) from e
                os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # -- many objects --------------------------------------------------------------

    def _parallel(
        self,
        jobs: list[tuple[str, str, int]],
        copy: Callable[[str, str], object],
        progress: ProgressFn | None,
    ) -> int:
        """Run ``copy(src, dst)`` for each ``(src, dst, size)`` on the pool.

        Progress is reported from this thread as files finish; the first failure
        cancels what has not started yet and is re-raised.
        """
        total, done, done_bytes = len(jobs), 0, 0
        if not jobs:
            if progress:
                progress(0, 0, 0)
            return 0
        with ThreadPoolExecutor(max_workers=min(self.workers, total)) as pool:
            futures: dict[Future[object], int] = {
                pool.submit(copy, src, dst): size for src, dst, size in jobs
            }
            pending = set(futures)
            try:
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        fut.result()  # raises the first failure
                        done += 1
                        done_bytes += futures[fut]
                    if progress:
                        progress(done, total, done_bytes)
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
        return done_bytes

    def upload_files(
        self,
        root: str,
        relpaths: Iterable[str],
        prefix: str,
        progress: ProgressFn | None = None,
    ) -> int:
        jobs = []
        for rel in materialise(relpaths):
            src = os.path.join(root, *rel.split("/"))
            jobs.append((src, join_key(prefix, rel), os.path.getsize(src)))
        return self._parallel(jobs, self.upload_file, progress)

    def download_prefix(
        self, prefix: str, local_dir: str, progress: ProgressFn | None = None
    ) -> list[str]:
        """Copy every file under ``prefix/`` (directory semantics) into ``local_dir``."""
        base = dir_prefix(prefix)
        rels, jobs = [], []
        for key in self.list(base):
            rel = key[len(base) :]
            src = self._path(key)
            dst = os.path.join(local_dir, *safe_relpath(rel).split("/"))
            rels.append(rel)
            jobs.append((src, dst, os.path.getsize(src)))
        for parent in {os.path.dirname(dst) for _, dst, _ in jobs}:
            os.makedirs(parent, exist_ok=True)
        self._parallel(jobs, shutil.copyfile, progress)
        return rels

    def list(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``; walks only the deepest directory it names."""
        start_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(start_rel) if start_rel else self.bucket
        keys: list[str] = []
        for dirpath, dirs, files in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self.bucket).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            # Prune subdirectories that cannot contain a matching key.
            dirs[:] = [
                d
                for d in dirs
                if (rel_dir + d + "/").startswith(prefix) or prefix.startswith(rel_dir + d + "/")
            ]
            keys.extend(
                rel_dir + name
                for name in files
                if not name.endswith(TMP_SUFFIX) and (rel_dir + name).startswith(prefix)
            )
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix/`` (directory semantics, never ``""``).

        Emptied directories are removed too, so a later ``list`` of the parent does
        not trip over them.  An empty prefix is refused: for ``LocalStore("/")`` it
        would mean the whole filesystem.
        """
        base = dir_prefix(prefix)
        if not base:
            raise ValueError("delete_prefix needs a non-empty prefix")
        count = 0
        for key in self.list(base):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))
                count += 1
        top = self._path(base.rstrip("/"))
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)  # only succeeds when empty
        return count
