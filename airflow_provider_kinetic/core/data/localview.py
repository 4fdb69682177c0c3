"""A local job's Data: the verified, read-only cache entry itself, never a copy.

On the local backend a ``Data`` argument's cache entry is a directory on the same
machine.  A job used to get a copy of it in its temp dir (3.5 s for 200 MB, paid by
every child of a sweep).  Now the function gets the entry's own path (``entry_path``),
as ``Data(fuse=True)`` always has: nothing is made per job, and every job of a machine
reads the same inodes.  The entry is read-only as a whole (files 0444, directories
0555, ``read_only_tree``), so the function cannot write, add or remove anything in
it.  Where the function's path must hold more than the entry (empty directories,
which the entry does not keep) or sit at a given place (a mount path), the job gets
a tree of directories of its own whose files are *symbolic links* to the entry's
files (``link_tree``): its own names, the entry's bytes.

Why links to the entry, not hard links: a hard link changes the inode's ctime,
which is what proves an entry unchanged since its completion marker
(``schemes/entrycheck.py``) and what the stat cache trusts, so every job would
re-hash the whole entry.  A symbolic link touches nothing of the entry.

What keeps a job from changing the cached bytes:

- an unprivileged job: the entry's files are mode 0444, so opening one for writing
  through the link fails (``PermissionError``); a job that ``chmod``s the file first
  moves its ctime, so the next reader's check hashes it and refuses it (as for
  ``Data(fuse=True)`` and volumes, which read the entry in place too);
- a job running as root ignores permission bits, so the runner gives it a mount
  namespace of its own (``enter_private_mounts``) in which every entry it reads is a
  read-only bind mount (``seal``): a write fails with ``EROFS``, whatever the mode.
  Where that cannot be done (no ``CAP_SYS_ADMIN``, not Linux) a root job gets a copy,
  as before (``needs_copy``), and the log says so.

Stdlib only (the runner imports it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import secrets
import shutil
import sys

log = logging.getLogger(__name__)

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

#: None: not tried yet; True: this process has a mount namespace of its own.
_private: bool | None = None
#: Entries already sealed read-only in this process's namespace.
_sealed: set[str] = set()


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def enter_private_mounts() -> bool:
    """Give this process (and the threads and children it starts from now on) a mount
    namespace of its own, so that ``seal`` is seen by this job only; False where it
    cannot (then a root job copies its Data).  Call it from the main thread before
    any pool is started.  Only for root: an unprivileged job needs none."""
    global _private
    if _private is not None:
        return _private
    _private = False
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    try:
        libc = _libc()
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        # Nothing mounted here may show on the host (nor the host's later mounts here).
        if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    except OSError as exc:
        log.warning(
            "a job running as root ignores read-only files and could not get a mount "
            "namespace of its own (%s): its Data is copied, not linked",
            exc,
        )
        return False
    _private = True
    return True


def needs_copy() -> bool:
    """Whether this job must copy its Data: root without a private mount namespace
    (permission bits do not bind it, and nothing else would)."""
    return os.geteuid() == 0 and not enter_private_mounts()


def seal(entry: str) -> bool:
    """Make ``entry`` read-only in this job's namespace (root only; once per entry):
    a bind mount of it onto itself, remounted read-only.  False for a root job without
    a namespace of its own (``needs_copy``); raises when the mount fails."""
    if os.geteuid() != 0 or entry in _sealed:
        return True
    if not enter_private_mounts():
        return False
    libc, path = _libc(), os.fsencode(entry)
    if libc.mount(path, path, None, _MS_BIND | _MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind mount of {entry}")
    flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY
    if libc.mount(None, path, None, flags, None) != 0:
        raise OSError(ctypes.get_errno(), f"read-only remount of {entry}")
    _sealed.add(entry)
    return True


def read_only_tree(entry: str) -> bool:
    """Whether the job may be handed ``entry`` itself: nothing in it can be written,
    added or removed by the job (root: the entry is ``seal``ed; anyone else: the
    entry's files are 0444 and every directory is without write bits, as the upload
    leaves them)."""
    if os.geteuid() == 0:
        return entry in _sealed
    try:
        return all(not os.stat(d).st_mode & 0o222 for d, _, _ in os.walk(entry))
    except OSError:
        return False


def entry_path(entry: str, is_dir: bool) -> str:
    """The path a function gets for the entry itself: the directory, or its one file."""
    if is_dir:
        return entry
    names = os.listdir(entry)
    if len(names) != 1:
        raise FileNotFoundError(f"the cache entry {entry} holds {len(names)} files, not one")
    return os.path.join(entry, names[0])


def link_tree(entry: str, target: str, is_dir: bool) -> str:
    """The job's view of the verified entry at ``target``: its directories made anew,
    each file a link to the entry's file.  Returns the path the function gets (a
    lone file's link for a single-file Data).  Built beside ``target`` and renamed
    into place, so ``target`` never shows half a tree."""
    target = os.path.abspath(target)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.view-{secrets.token_hex(6)}")
    try:
        os.makedirs(tmp)
        for dirpath, dirnames, filenames in os.walk(entry):
            rel = os.path.relpath(dirpath, entry)
            here = tmp if rel == "." else os.path.join(tmp, rel)
            for name in dirnames:
                os.mkdir(os.path.join(here, name))
            for name in filenames:
                os.symlink(os.path.join(dirpath, name), os.path.join(here, name))
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if is_dir:
        return target
    names = os.listdir(target)
    if len(names) != 1:
        raise FileNotFoundError(f"the cache entry {entry} holds {len(names)} files, not one")
    return os.path.join(target, names[0])


def _publish(tmp: str, target: str) -> None:
    """``tmp`` becomes ``target`` (an empty existing directory is replaced; a mount
    point that exists already is filled entry by entry)."""
    try:
        os.rename(tmp, target)
        return
    except OSError:
        pass
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(tmp):
        os.replace(os.path.join(tmp, name), os.path.join(target, name))
