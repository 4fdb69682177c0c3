"""kinetic's content-addressed data cache on any ObjectStore.

Layout: ``default/data-cache/{hash}/...`` holds the content and the empty marker
``default/data-markers/{hash}`` is written *last*, so a marker means "complete": a
present marker is a hit and nothing is uploaded; an interrupted upload leaves no
marker and is redone by the next submit.

What is uploaded is exactly the file list the content hash covered
(``Data.hashed_files``), not a second walk that could see a different tree.
"""

from __future__ import annotations

import contextvars
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.data.refs import (
    CACHE_PREFIX,
    MARKER_PREFIX,
    cache_key,
    marker_key,
)
from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path

__all__ = ["CACHE_PREFIX", "MARKER_PREFIX", "cache_key", "marker_key", "upload_all", "upload_data"]

log = logging.getLogger(__name__)

LARGE_DATA_BYTES = 10 * 1024**3


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def upload_data(store: ObjectStore, data: Data) -> bool:
    """Ensure ``data``'s content is in the cache; returns True when it uploaded.

    A hit (marker present) uploads nothing and returns False.
    """
    digest = data.content_hash()
    if store.exists(marker_key(digest)):
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
    step = max(1, len(files) // 10)

    def progress(done: int, n: int, nbytes: int) -> None:
        if done == n or done % step == 0:
            log.info("  %s: %d/%d files, %s", data.path, done, n, _human(nbytes))

    store.upload_files(root, [rel for rel, _ in files], prefix, progress=progress)
    if store.scheme == "file":
        _make_read_only(file_uri_path(store.uri(prefix)))
    store.write_bytes(marker_key(digest), b"")
    metrics.incr("kinetic.data.uploaded_bytes", total)
    metrics.incr("kinetic.data.uploaded_files", len(files))
    return True


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
