"""How a ``LocalStore`` write lands on disk: copies in the kernel where it can, the
error for a full disk, whether a staged file's writer lives, and hashing on the way."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
from typing import BinaryIO

from airflow_provider_kinetic.core.storage.base import StoreFullError


def copy_open(src: BinaryIO, dst: BinaryIO) -> None:
    """Copy the open file ``src`` into ``dst``: in the kernel (Linux ``sendfile``, from
    the file's own position) where it can, else through a buffer from where it stopped."""
    if sys.platform.startswith("linux"):
        try:
            while os.sendfile(dst.fileno(), src.fileno(), None, 1 << 30):
                pass
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
                raise
    shutil.copyfileobj(src, dst, 1024 * 1024)


def full_error(uri: str, path: str, size: int | None, exc: OSError) -> StoreFullError:
    """The error for a write that ran out of space or quota, saying what was written
    where, how big it was and how much room is left (where the OS can tell)."""
    what = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    free = free_bytes(path)
    sized = f"{size} bytes" if size is not None else "size unknown"
    room = f"{free} bytes free there" if free is not None else "free space unknown"
    return StoreFullError(
        f"{what} writing {uri} ({sized}) at {path} ({room}); nothing was written under "
        "that name: free space (or raise the quota) and retry",
        exc.errno,
    )


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (its
    nearest existing parent), or ``None`` where the OS cannot tell."""
    while path and not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def writer_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


class Hashing:
    """A file read through ``read`` whose bytes also go into ``h`` (None: only read)."""

    def __init__(self, f: BinaryIO, h: hashlib._Hash | None) -> None:
        self.f, self.h = f, h

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if self.h is not None:
            self.h.update(data)
        return data
