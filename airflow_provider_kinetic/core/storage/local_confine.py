"""Reads of a ``LocalStore`` never leave its root.

Reads never leave the root: the store's directories are written by jobs (a local
job's output dir is a directory of the store), so a key may be a symlink, or lie
under one.  Every read (``read_bytes``, ``download_file``/``download_prefix``,
``stat``, ``exists``, ``list``, and ``swap.read_versioned``) resolves the key's path
and refuses one that leads out of the root with ``OutsideStoreError`` naming the key;
a link to a file inside the root is served as that file.  The file is then opened
without following a last link, and (on Linux) the open file's own path is checked
again, so a link swapped in between the check and the open is refused too.
``list`` never descends into a symlinked directory and leaves out links that lead
outside.  Writes and deletes act on the names themselves (``os.replace`` and
``os.unlink`` replace or remove a link, never its target).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from airflow_provider_kinetic.core.storage.base import ObjectNotFound, OutsideStoreError

#: Open flags of a read: no last-component link (the path given is already resolved).
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: Where Linux shows an open descriptor's path (the post-open check; absent elsewhere).
_PROC_FD = "/proc/self/fd"


def inside(path: str, root: str) -> bool:
    """Whether the (real) ``path`` is ``root`` or lies under it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def outside(uri: str, key: str, root: str, real: str) -> OutsideStoreError:
    return OutsideStoreError(
        f"{uri} (key {key!r}) leads outside the store root {root} "
        f"(to {real}): a symlink out of the store is never followed; read refused"
    )


def read_path(root: str, path: str, key: str, uri: str) -> str:
    """The real path of ``path`` (``key``'s) for a read: every symlink on the way
    resolved (a missing tail is kept as written, so the read reports it absent); raises
    ``OutsideStoreError`` when that path is not inside the (real) root."""
    real = os.path.realpath(path)
    if not inside(real, os.path.realpath(root)):
        raise outside(uri, key, root, real)
    return real


def open_read(root: str, path: str, key: str, uri: str) -> BinaryIO:
    """``key`` open for reading, proven inside the root: resolved first
    (``read_path``), opened without following a last link, and on Linux checked
    again by the open file's own path (a directory on the way swapped for a link
    after the check is caught there).  A missing object or a directory raises
    ``ObjectNotFound``."""
    real = read_path(root, path, key, uri)
    try:
        fd = os.open(real, _READ_FLAGS)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
        raise ObjectNotFound(uri) from e
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link appeared at the name since the check
            raise outside(uri, key, root, f"a symlink that appeared at {real}") from e
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ObjectNotFound(uri)
        try:
            opened = os.readlink(f"{_PROC_FD}/{fd}")
        except OSError:
            opened = real  # no /proc: the resolved path's check stands
        if not inside(opened, os.path.realpath(root)):
            raise outside(uri, key, root, opened)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def stat_file(root: str, path: str, key: str, uri: str) -> os.stat_result:
    """The stat of the file ``key`` is (or links to, inside the root); raises
    ``ObjectNotFound`` when absent, ``OutsideStoreError`` when it leads out."""
    try:
        st = os.stat(read_path(root, path, key, uri))
    except (FileNotFoundError, NotADirectoryError) as e:
        raise ObjectNotFound(uri) from e
    if not stat.S_ISREG(st.st_mode):
        raise ObjectNotFound(uri)
    return st


def list_keys(bucket: str, prefix: str, skip_suffix: str) -> list[str]:
    """Keys of ``bucket`` starting with ``prefix``; walks only the deepest directory it
    names, and skips names ending with ``skip_suffix`` (in-flight temporary files).

    Regular files, and links to files inside the root; never a symlinked directory's
    contents (not descended), nor a link that leads outside.  A prefix whose directory
    itself leads outside lists nothing."""
    start_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    root = os.path.realpath(bucket)
    start = os.path.join(bucket, *start_rel.split("/")) if start_rel else bucket
    if start_rel and not inside(os.path.realpath(start), root):
        return []
    keys: list[str] = []
    todo = [start_rel + "/" if start_rel else ""]
    while todo:
        rel_dir = todo.pop()
        try:
            with os.scandir(os.path.join(bucket, *rel_dir.split("/"))) as it:
                entries = list(it)
        except OSError:  # gone, or not a directory: nothing under it (as os.walk)
            continue
        for entry in entries:
            rel = rel_dir + entry.name
            if entry.name.endswith(skip_suffix):
                continue
            try:
                if entry.is_symlink():
                    real = os.path.realpath(entry.path)
                    if inside(real, root) and os.path.isfile(real) and rel.startswith(prefix):
                        keys.append(rel)
                elif entry.is_dir(follow_symlinks=False):
                    # Prune subdirectories that cannot contain a matching key.
                    if (rel + "/").startswith(prefix) or prefix.startswith(rel + "/"):
                        todo.append(rel + "/")
                elif entry.is_file(follow_symlinks=False) and rel.startswith(prefix):
                    keys.append(rel)
            except OSError:
                continue  # removed while listed
    return sorted(keys)
