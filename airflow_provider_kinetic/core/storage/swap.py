"""Compare-and-swap on one small object: the primitive a key's pointer moves with.

``read_versioned`` returns an object's bytes with a *generation token*; ``swap``
writes new bytes only if the object still has that token, else raises
``PreconditionFailed`` (the caller re-reads and retries).  Token ``0`` means "absent",
so the first writer of a name is a swap too.

- ``gs://``: the object's generation, sent as ``if_generation_match`` (GCS checks it
  server-side, atomically).  Retries stay on: a retried conditional write that had
  landed answers 412, which callers detect by re-reading (their own write is there).
- ``file://``: a token made of the file's inode, mtime and size (every write is a new
  file renamed into place, so the inode changes); the check and the rename run
  under an exclusive ``flock`` on one lock file per store root, so two processes
  cannot both pass the check.  The lock file ends with ``.kinetic-tmp``: listings
  skip it.

Kept apart from ``gcs.py``/``local.py`` (which know nothing of tokens) so both stay
what they were; nothing here imports google-cloud-storage at module level.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator

from airflow_provider_kinetic.core.storage.base import ObjectStore, PreconditionFailed

#: The token of an object that does not exist.
ABSENT = "0"
#: One lock file per local store root (the suffix keeps it out of listings).
LOCK_NAME = ".swap-lock.kinetic-tmp"


def read_versioned(store: ObjectStore, key: str) -> tuple[bytes | None, str]:
    """``(bytes, token)`` of ``key``; ``(None, ABSENT)`` when it does not exist."""
    if store.scheme == "gs":
        return _gcs_read(store, key)
    try:  # a link out of the root raises OutsideStoreError (local.py)
        with store._open_read(key) as f:  # type: ignore[attr-defined]  # LocalStore
            return f.read(), _token(os.fstat(f.fileno()))
    except (FileNotFoundError, NotADirectoryError):
        return None, ABSENT


def swap(store: ObjectStore, key: str, data: bytes | None, token: str) -> None:
    """Replace ``key`` with ``data`` (``None``: delete it) if its token is still
    ``token``; raises ``PreconditionFailed`` when another writer moved it first."""
    if store.scheme == "gs":
        _gcs_swap(store, key, data, token)
        return
    path = _local_path(store, key)
    with _root_lock(store):
        try:
            current = _token(os.stat(path))
        except (FileNotFoundError, NotADirectoryError):
            current = ABSENT
        if current != token:
            raise PreconditionFailed(store.uri(key))
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}-{secrets.token_hex(6)}.kinetic-tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _token(st: os.stat_result) -> str:
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


def _local_path(store: ObjectStore, key: str) -> str:
    return store._path(key)  # type: ignore[attr-defined]  # LocalStore


@contextlib.contextmanager
def _root_lock(store: ObjectStore) -> Iterator[None]:
    os.makedirs(store.bucket, exist_ok=True)
    fd = os.open(os.path.join(store.bucket, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _gcs_read(store: ObjectStore, key: str) -> tuple[bytes | None, str]:
    from google.api_core import exceptions as gexc
    from google.cloud.storage.retry import DEFAULT_RETRY

    blob = store._blob(key)  # type: ignore[attr-defined]  # GcsStore
    try:
        data = blob.download_as_bytes(retry=DEFAULT_RETRY)
    except gexc.NotFound:
        return None, ABSENT
    return data, str(blob.generation)


def _gcs_swap(store: ObjectStore, key: str, data: bytes | None, token: str) -> None:
    from google.api_core import exceptions as gexc
    from google.cloud.storage.retry import DEFAULT_RETRY

    blob = store._blob(key)  # type: ignore[attr-defined]  # GcsStore
    generation = int(token)
    try:
        if data is None:
            if generation == 0:
                return
            blob.delete(if_generation_match=generation, retry=DEFAULT_RETRY)
        else:
            blob.upload_from_string(
                data,
                content_type="application/json",
                if_generation_match=generation,
                retry=DEFAULT_RETRY,
            )
    except gexc.PreconditionFailed as e:
        raise PreconditionFailed(store.uri(key)) from e
    except gexc.NotFound as e:  # deleted under us: the token no longer holds
        raise PreconditionFailed(store.uri(key)) from e


__all__ = ["ABSENT", "read_versioned", "swap"]
