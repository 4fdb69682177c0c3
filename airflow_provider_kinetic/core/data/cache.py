"""kinetic's content-addressed data cache on any ObjectStore.

Layout: ``default/data-cache/{hash}/...`` holds the content and the empty marker
``default/data-markers/{hash}`` is written *last*, so a marker means "complete": a
present marker is a hit and nothing is uploaded; an interrupted upload leaves no
marker and is redone by the next submit.

The marker is written only when the bytes the upload sent hash to the entry's name:
each file's digest is taken from the bytes as they are read for the upload (where the
store can, ``ObjectStore.upload_files(digests=)``; else the file is read again after
its upload), so a file that changed between hashing and upload fails the upload,
naming it, and leaves no marker: the next run uploads the entry again instead of
every later run hitting an entry whose bytes are not its name.  An upload the store
has no room for (``StoreFullError``) removes what it copied of the entry: a full disk
keeps no content without a marker.

What is uploaded is exactly the file list the content hash covered
(``Data.hashed_files``), not a second walk that could see a different tree.

On a local store a hit is verified too (``schemes/entrycheck.py``): the local
backend's jobs read entries in place, so a corrupt one is removed here and uploaded
again from the Data's source before any job reads it.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.data.refs import (
    CACHE_PREFIX,
    EMPTY_TREE_HASH,
    MARKER_PREFIX,
    cache_key,
    marker_key,
)
from airflow_provider_kinetic.core.data.schemes import entrycheck
from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path
from airflow_provider_kinetic.core.storage.base import FileDigests, StoreFullError

__all__ = [
    "CACHE_PREFIX",
    "MARKER_PREFIX",
    "DataChangedDuringUpload",
    "cache_key",
    "marker_key",
    "upload_all",
    "upload_data",
]

log = logging.getLogger(__name__)

LARGE_DATA_BYTES = 10 * 1024**3
#: An upload shows progress lines once it has run this long (seconds).
PROGRESS_AFTER_S = 5.0
_clock = time.monotonic


class DataChangedDuringUpload(KineticError, RuntimeError):
    """The bytes an upload sent do not hash to the entry's name: a file of the Data
    changed between its hashing and its upload.  No marker is written."""


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def upload_data(store: ObjectStore, data: Data) -> bool:
    """Ensure ``data``'s content is in the cache; returns True when it uploaded.

    A hit (marker present) uploads nothing and returns False; on a local store only
    once the entry is verified (``_entry_sound``).
    """
    digest = data.content_hash()
    if store.exists(marker_key(digest)) and _entry_sound(store, data, digest):
        log.info("data cache hit for %s (%s): nothing to upload", data.path, digest[:12])
        metrics.incr("kinetic.data.cache_hits")
        return False
    metrics.incr("kinetic.data.cache_misses")
    prefix = cache_key(digest)
    root, files = data.hashed_files()
    total = sum(size for _, size in files)
    if total > LARGE_DATA_BYTES:
        log.warning(
            "%s is %s; for data this large prefer a gs:// URI (optionally fuse=True)",
            data.path,
            _human(total),
        )
    log.info(
        "uploading %s: %d file(s), %s -> %s",
        data.path,
        len(files),
        _human(total),
        store.uri(prefix),
    )
    step, started, shown = max(1, len(files) // 10), _clock(), [False]

    def progress(done: int, n: int, nbytes: int) -> None:
        # Lines only for an upload long enough to need them: from the first report
        # after PROGRESS_AFTER_S on (decided once; a 1 KiB upload shows none).
        if not shown[0] and _clock() - started < PROGRESS_AFTER_S:
            return
        shown[0] = True
        if done == n or done % step == 0:
            log.info("  %s: %d/%d files, %s", data.path, done, n, _human(nbytes))

    digests = FileDigests(_digest_prefix)
    try:
        store.upload_files(
            root, [rel for rel, _ in files], prefix, progress=progress, digests=digests
        )
        _verify_upload(store, data, digest, root, files, digests)
        if store.scheme == "file":
            _make_read_only(file_uri_path(store.uri(prefix)))
        store.write_bytes(marker_key(digest), b"")
    except StoreFullError:
        _drop_unmarked(store, digest)
        raise
    metrics.incr("kinetic.data.uploaded_bytes", total)
    metrics.incr("kinetic.data.uploaded_files", len(files))
    return True


def _drop_unmarked(store: ObjectStore, digest: str) -> None:
    """After an upload the store had no room for: delete what it copied of the entry
    (unless a marker says another upload completed it meanwhile), so a full disk keeps
    no content without a marker, which nothing reads and ``data gc`` never collects.
    (The copy pool has finished every file by the time the error is raised.)"""
    if store.exists(marker_key(digest)):
        return
    try:
        removed = store.delete_prefix(cache_key(digest))
    except OSError as exc:
        log.warning("could not remove the incomplete cache entry %s: %s", digest, exc)
        return
    log.warning(
        "the store had no room for data cache entry %s: removed the %d file(s) it had "
        "copied (an entry without a marker is never read)",
        store.uri(cache_key(digest)),
        removed,
    )


def _entry_sound(store: ObjectStore, data: Data, digest: str) -> bool:
    """A hit on a local store: its jobs read the entry in place (volume links, FUSE
    paths), so it is verified here too, while the Data's source is at hand (with the
    stat cache, one ``lstat`` per file when nothing changed).  A corrupt entry is
    removed, marker first, and the caller uploads it again from the source."""
    if store.scheme != "file" or digest == EMPTY_TREE_HASH:  # no entry dir to read
        return True
    path = file_uri_path(store.uri(cache_key(digest)))
    check = entrycheck.check_entry(path, digest, data.is_dir)
    if check.sound:
        return True
    log.warning(
        "data cache entry %s of %s is bad: expected content hash %s (its name), found "
        "%s; %s Uploading it again from %s",
        path,
        data.path,
        digest,
        check.actual,
        entrycheck.remove_entry(store, cache_key(digest)),
        data.local_path,
    )
    return False


def _digest_prefix(rel: str) -> bytes:
    """kinetic's file digest prefix (``relpath + NUL``; a lone file's basename)."""
    return rel.encode() + b"\0"


def _verify_upload(
    store: ObjectStore,
    data: Data,
    digest: str,
    root: str,
    files: list[tuple[str, int]],
    digests: FileDigests,
) -> None:
    """Raise ``DataChangedDuringUpload`` unless the bytes sent hash to ``digest``
    (kinetic's content hash, from the files' digests in hash order)."""
    parts = []
    for rel, _ in files:
        path = os.path.join(root, *rel.split("/"))
        prefix = _digest_prefix(rel)
        got = digests.found.get(path)
        parts.append(got[1] if got is not None and got[0] == prefix else _read(path, prefix))
    kind = b"dir:" if data.is_dir else b"file:"
    if hashlib.sha256(kind + b"".join(parts)).hexdigest() == digest:
        return
    then = data.hashed_stats()
    changed = []
    for rel, _ in files:
        path = os.path.join(root, *rel.split("/"))
        got = digests.found.get(path)
        now = got[2] if got is not None else _stat(path)
        if then.get(rel) != now:
            changed.append(rel)
    what = f"changed: {', '.join(changed)}" if changed else "a file of it changed"
    raise DataChangedDuringUpload(
        f"data {data.path} changed between its hashing and its upload ({what}): the "
        f"bytes sent do not hash to {digest}, so the cache entry {store.uri(cache_key(digest))} "
        "was not marked complete (no job reads it; the next run uploads it again). "
        "Let whatever writes the data finish before the task runs, then retry"
    )


def _read(path: str, prefix: bytes) -> bytes:
    """A file's digest read again (a store that could not hash it on the way)."""
    h = hashlib.sha256(prefix)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return b""  # gone or unreadable since: not the bytes that were hashed
    return h.digest()


def _stat(path: str) -> tuple[int, ...] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _make_read_only(path: str) -> None:
    """Cache entries are immutable; on the local backend FUSE data is served straight
    from them, so drop write permission (as a read-only mount would)."""
    for dirpath, _, files in os.walk(path):
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o444)


def upload_all(store: ObjectStore, items: list[Data], workers: int = 4) -> dict[str, bool]:
    """Upload distinct local Data concurrently; returns {hash: uploaded?}.  Each upload
    runs in a copy of the caller's context (its metrics scope: a trigger's tags)."""
    by_hash: dict[str, Data] = {}
    for d in items:
        by_hash.setdefault(d.content_hash(), d)
    if not by_hash:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(by_hash))) as pool:
        runs = [contextvars.copy_context().run for _ in by_hash]
        results = pool.map(lambda run, d: run(upload_data, store, d), runs, by_hash.values())
        return dict(zip(by_hash, results, strict=True))
