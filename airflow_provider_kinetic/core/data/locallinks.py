"""Volume mount paths on the local backend: links shared by reference count.

On the local backend a mount path is a real path on the worker, so a job may only
create a *link* there, and only where nothing existed before; the link goes when the
last job using it ends.  Concurrent jobs (batch children, parallel tasks) often mount
the same cached Data at the same path: they share the link.  A path that exists for
any other reason, or a link to different content, is an error naming the path and
what holds it.  The counts live in the temp dir, guarded by a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator

STATE_DIR = "kinetic-mounts"
#: Set by the local backend: mount paths are host paths, so volumes become links.
LOCAL_MOUNTS_ENV = "KINETIC_LOCAL_MOUNTS"
#: The machine's temp dir, set by the local supervisor, which gives each job a temp dir
#: of its own (``TMPDIR``): the counts must be shared by every job on the machine.
HOST_TMPDIR_ENV = "KINETIC_HOST_TMPDIR"


def _shared_tmp() -> str:
    return os.environ.get(HOST_TMPDIR_ENV) or tempfile.gettempdir()


@contextlib.contextmanager
def _locked(mount: str) -> Iterator[str]:
    """Hold the mount path's lock; the last user removes the lock file (and the state
    dir when empty), so nothing is left in the temp dir between jobs."""
    state = os.path.join(_shared_tmp(), STATE_DIR)
    base = os.path.join(state, hashlib.sha256(mount.encode()).hexdigest()[:32])
    while True:
        os.makedirs(state, mode=0o700, exist_ok=True)
        try:
            lock = open(base + ".lock", "a")  # noqa: SIM115 - closed below
        except FileNotFoundError:  # the state dir went away in between
            continue
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:  # the file we locked must still be the one at the path
            same = os.path.samestat(os.fstat(lock.fileno()), os.stat(base + ".lock"))
        except FileNotFoundError:
            same = False
        if same:
            break
        lock.close()
    try:
        yield base + ".json"
    finally:
        if not os.path.exists(base + ".json"):  # no user left
            os.unlink(base + ".lock")
            with contextlib.suppress(OSError):
                os.rmdir(state)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def acquire(mount: str, target: str) -> None:
    """Make ``mount`` a link to ``target`` (or join an identical one); raises naming it."""
    target = os.path.realpath(target)
    with _locked(mount) as refs_path:
        refs = _read(refs_path)
        if os.path.lexists(mount):
            ours = refs is not None and os.path.islink(mount) and refs["target"] == target
            if not ours:
                holder = (
                    f"a link to {os.readlink(mount)!r}"
                    if os.path.islink(mount)
                    else "an existing path"
                )
                raise FileExistsError(
                    f"volume mount path {mount!r} is already taken by {holder}; on the local "
                    "backend a mount path must not exist before the job (or be the same Data "
                    "mounted by another running job)"
                )
            refs["count"] += 1
        else:
            os.makedirs(os.path.dirname(mount) or "/", exist_ok=True)
            os.symlink(target, mount)
            refs = {"target": target, "count": 1}
        _write(refs_path, refs)


def release(mount: str, target: str) -> None:
    """Drop one use of the link; the last user removes it (and only a link it made)."""
    target = os.path.realpath(target)
    with _locked(mount) as refs_path:
        refs = _read(refs_path)
        if refs is None or refs["target"] != target:
            return
        refs["count"] -= 1
        if refs["count"] > 0:
            _write(refs_path, refs)
            return
        if os.path.islink(mount) and os.path.realpath(mount) == target:
            os.unlink(mount)
        os.remove(refs_path)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def _write(path: str, refs: dict) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(refs, f)
    os.replace(tmp, path)
