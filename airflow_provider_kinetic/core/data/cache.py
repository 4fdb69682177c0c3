"""kinetic's content-addressed data cache on any ObjectStore.

Two layouts (``refs.layout_for``: the connection's ``data_layout``).  ``files``, the
default, is incremental (``incremental.py``: one object per distinct file content and
a manifest per tree; on a local store the per-tree entry dir below is kept too, as
hard links, and its marker written last); ``kinetic`` is kinetic 0.0.4's per-tree
layout, described here.

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
from airflow_provider_kinetic.core.data import incremental
from airflow_provider_kinetic.core.data.incremental import DataChangedDuringUpload
from airflow_provider_kinetic.core.data.refs import (
    CACHE_PREFIX,
    EMPTY_TREE_HASH,
    FILES_LAYOUT,
    MARKER_PREFIX,
    cache_key,
    layout_for,
    marker_key,
    tree_key,
)
from airflow_provider_kinetic.core.data.schemes import entrycheck
from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path
from airflow_provider_kinetic.core.storage.base import FileDigests, StoreFullError

__all__ = [
    "CACHE_PREFIX",
    "MARKER_PREFIX",
    "DataChangedDuringUpload",
    "cache_key",
    "layout_for",
    "marker_key",
    "upload_all",
    "upload_data",
]

log = logging.getLogger(__name__)

LARGE_DATA_BYTES = 10 * 1024**3
#: An upload shows progress lines once it has run this long (seconds).
PROGRESS_AFTER_S = 5.0
_clock = time.monotonic


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def complete_key(store: ObjectStore, digest: str, layout: str) -> str:
    """The object whose presence says the content is complete: the marker, except
    for the incremental layout on a bucket, whose manifest is written last."""
    if layout == FILES_LAYOUT and store.scheme != "file":
        return tree_key(digest)
    return marker_key(digest)


def upload_data(store: ObjectStore, data: Data, layout: str | None = None) -> bool:
    """Ensure ``data``'s content is in the cache; returns True when it uploaded.

    A hit (marker, or a bucket's manifest, present) uploads nothing and returns False;
    on a local store only once the entry is verified (``_entry_sound``).  ``layout``:
    ``files`` (incremental) or ``kinetic`` (per tree); default ``layout_for``.
    """
    digest = data.content_hash()
    layout = layout_for(store, data.fuse, layout)
    done = complete_key(store, digest, layout)
    if store.exists(done) and _entry_sound(store, data, digest):
        log.info("data cache hit for %s (%s): nothing to upload", data.path, digest[:12])
        metrics.incr("kinetic.data.cache_hits")
        return False
    metrics.incr("kinetic.data.cache_misses")
    if layout == FILES_LAYOUT:
        return _upload_incremental(store, data, digest, done)
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
        if store.scheme == "file":  # readers trust it unchanged since (entrycheck.sealed)
            entrycheck.stamp_marker(file_uri_path(store.uri(prefix)))
    except StoreFullError:
        _drop_unmarked(store, digest)
        raise
    metrics.incr("kinetic.data.uploaded_bytes", total)
    metrics.incr("kinetic.data.uploaded_files", len(files))
    return True


def _upload_incremental(store: ObjectStore, data: Data, digest: str, done: str) -> bool:
    """The ``files`` layout (``incremental.py``): only the file contents the store
    lacks are sent; on a local store the entry dir is then linked to them and the
    marker written last.  A concurrent upload of the same content is waited for."""
    if not incremental.claim(store, digest, lambda: store.exists(done)):
        log.info("data %s (%s) was uploaded by another task meanwhile", data.path, digest[:12])
        return False
    try:
        root, files = data.hashed_files()
        manifest, sent = incremental.upload_tree(store, digest, root, files, data.is_dir, data.path)
        if store.scheme == "file":
            incremental.link_entry(store, manifest)
            store.write_bytes(marker_key(digest), b"")
            entrycheck.stamp_marker(file_uri_path(store.uri(cache_key(digest))))
    finally:
        incremental.release(store, digest)
    log.info(
        "uploaded %s (%s): %d of %d file(s) sent, %s; %d already stored",
        data.path,
        digest[:12],
        sent.files,
        len(files),
        _human(sent.bytes),
        sent.reused,
    )
    metrics.incr("kinetic.data.uploaded_bytes", sent.bytes)
    metrics.incr("kinetic.data.uploaded_files", sent.files)
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
    """Cache entries are immutable; on the local backend jobs read them in place (their
    Data, volumes, FUSE data), so drop write permission from the files and the
    directories (as a read-only mount would: no file is changed, added or removed)."""
    incremental.make_read_only(path)


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
