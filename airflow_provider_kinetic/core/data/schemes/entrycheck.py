"""A data-cache entry read in place, verified first (the local backend).

On the local backend a volume is a link to the read-only cache entry and a
``Data(fuse=True)`` argument is the entry's own path: no download, so none of the
download's checks (``download.py``).  Such an entry is hashed here with kinetic's
content hash, which must be its name, before it is linked or handed over.  With the
machine's stat cache (``core/data/hashing/statcache.py``) a re-check of an entry whose
files' ``lstat`` facts are all unchanged reads no byte; a file written since (a
flipped byte moves its ctime, which user code cannot set back) is read again.  The
runner checks each entry once per job (``verify_entry``'s ``seen``).

A bad entry is refused, named (its path, what used it, the expected and actual
hash) and removed, marker first, so that the next submit of its Data uploads it
again from its source (``core/data/cache.py`` checks the entry at submit for the
same reason: a source still there is uploaded again before the job starts).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from dataclasses import dataclass

from airflow_provider_kinetic.core.data.hashing.statcache import StatCache
from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.data.hashing.treewalk import DataPathError
from airflow_provider_kinetic.core.data.manifest import Manifest, ManifestError
from airflow_provider_kinetic.core.data.refs import CACHE_PREFIX, MARKER_PREFIX, file_key, tree_key
from airflow_provider_kinetic.core.data.schemes.download import DataHashMismatch, expected_hash
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path, store_for_uri

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EntryCheck:
    """What hashing a cache entry in place found."""

    path: str  # the entry's directory
    expected: str  # its name: the content hash it must have
    actual: str  # what its files hash to (or why they do not hash)

    @property
    def sound(self) -> bool:
        return self.actual == self.expected


def marker_path(path: str) -> str:
    """The completion marker of the local entry dir ``path`` (``.../data-cache/{hash}``
    -> ``.../data-markers/{hash}``)."""
    cache_dir, digest = os.path.split(os.path.normpath(path))
    return os.path.join(os.path.dirname(cache_dir), MARKER_PREFIX.rsplit("/", 1)[1], digest)


def _ctimes(path: str) -> list[int] | None:
    """The ctime of the entry dir and of everything in it; None at a link or special
    file (not what an upload makes)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(path):
        found.append(os.lstat(dirpath).st_ctime_ns)
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if not stat.S_ISREG(st.st_mode):
                return None
            found.append(st.st_ctime_ns)
        if any(os.path.islink(os.path.join(dirpath, d)) for d in dirnames):
            return None
    return found


def sealed(path: str) -> bool:
    """Whether nothing in the entry at ``path`` changed since its marker was written
    (every ctime strictly before the marker's): then it holds the bytes its upload
    verified."""
    try:
        mark = os.lstat(marker_path(path)).st_ctime_ns
        ctimes = _ctimes(path)
    except OSError:
        return False
    return ctimes is not None and len(ctimes) > 1 and max(ctimes) < mark


def stamp_marker(path: str, deadline_s: float = 2.0) -> None:
    """After writing the marker of the entry at ``path``: touch it until its ctime is
    later than every ctime in the entry (the file system's clock ticks coarsely, so
    the last ``chmod`` and the marker may share a tick); ``sealed`` then holds until
    something changes.  Gives up quietly at the deadline (readers then hash)."""
    marker = marker_path(path)
    ctimes = _ctimes(path)
    if not ctimes:
        return
    newest, end = max(ctimes), time.monotonic() + deadline_s
    while os.lstat(marker).st_ctime_ns <= newest and time.monotonic() < end:
        time.sleep(0.002)  # the next tick of the file system's clock
        os.utime(marker)


def check_entry(path: str, expected: str, is_dir: bool) -> EntryCheck:
    """Hash the entry at ``path`` as the Data it holds (a directory, or the one file
    of a single-file Data) and compare with ``expected``; an entry ``sealed`` since
    its marker is sound without reading a byte."""
    if not os.path.isdir(path):
        return EntryCheck(path, expected, "nothing: the entry is missing")
    if os.path.basename(os.path.normpath(path)) == expected and sealed(path):
        return EntryCheck(path, expected, expected)
    target = path
    if not is_dir:
        names = sorted(os.listdir(path))
        if len(names) != 1:
            return EntryCheck(path, expected, f"{len(names)} files where one was expected")
        target = os.path.join(path, names[0])
    try:
        actual = content_hash(target, path, StatCache.default()).hexdigest
    except DataPathError as exc:  # a link or special file: not what an upload makes
        actual = f"unhashable ({exc})"
    return EntryCheck(path, expected, actual)


def verify_entry(uri: str, is_dir: bool, used: str, seen: set[str] | None = None) -> str:
    """The local path of the cache entry ``uri`` names, once its content hashes to its
    name; else raise ``DataHashMismatch`` naming it, after removing it.  ``used``: what
    reads it, for the error ("the volume at /data").  ``seen``: entries already
    verified in this job (checked once each)."""
    store, key = store_for_uri(uri.rstrip("/"))
    path = file_uri_path(uri.rstrip("/"))
    expected = expected_hash(key)
    if expected is None or (seen is not None and path in seen):
        return path
    check = check_entry(path, expected, is_dir)
    if not check.sound:
        removed = remove_entry(store, key)
        raise DataHashMismatch(
            f"data cache entry {path} ({used}) is bad: expected content hash {expected} "
            f"(its name), found {check.actual}; refused before the function ran. {removed}"
        )
    if seen is not None:
        seen.add(path)
    return path


def _drop_bad_files(store: ObjectStore, head: str, digest: str) -> None:
    """The incremental layout: the entry's files are hard links to its file objects,
    so a corrupt entry file is a corrupt object; every object the entry's manifest
    names whose bytes are not its name goes too (with the manifest), so the next
    upload sends it again instead of linking the bad one."""
    tree = head + tree_key(digest)  # ``head``: the store root's path, under "/"
    try:
        manifest = Manifest.decode(store.read_bytes(tree), tree)
    except (OSError, ManifestError, KineticError):
        return
    for sha in manifest.shas():
        path = file_uri_path(store.uri(head + file_key(sha)))
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except OSError:
            continue
        if h.hexdigest() != sha:
            log.warning("data file object %s holds other bytes than its name: removed", path)
            store.delete(head + file_key(sha))
    store.delete(tree)


def remove_entry(store: ObjectStore, key: str) -> str:
    """Remove the bad entry at ``key`` (``.../data-cache/{hash}``): its marker first (no
    submit then takes it for complete), then its files.  Says what was done."""
    head, _, digest = key.rstrip("/").rpartition(CACHE_PREFIX)
    marker = head + MARKER_PREFIX + digest
    try:
        store.delete(marker)
        _drop_bad_files(store, head, digest.strip("/"))
        store.delete_prefix(key)
    except OSError as exc:
        log.warning("could not remove the bad data cache entry %s: %s", store.uri(key), exc)
        return (
            f"It could not be removed ({exc}): remove {store.uri(marker)} so the next "
            "submit of its Data uploads it again."
        )
    log.warning("data cache entry %s was corrupt: removed", store.uri(key))
    return (
        "It was removed: the next submit of its Data uploads it again from its source "
        "(retry the task)."
    )
