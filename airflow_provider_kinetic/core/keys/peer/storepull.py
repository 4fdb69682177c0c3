"""A broadcast's read from the store: the files of one content hash, each placed
and announced as it lands (so the reader's own children get it at once), with the
store's own parallelism (``ObjectStore.workers_for``: a bucket's round trip wants
many requests in flight) and each file's digest taken for the tree check
(``peer/receiving.py``'s rules: a temporary name, the digest, then the rename).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.keys.peer.protocol import file_sha
from airflow_provider_kinetic.core.keys.peer.receiving import OnFile, kept, part_of
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.base import FileDigests
from airflow_provider_kinetic.core.storage.stat import stat_objects


def store_manifest(store: ObjectStore, version: str, kind: str, name: str) -> list[list[Any]]:
    """``[[relpath, size], ...]`` of ``version`` in the store's data cache (one listing)."""
    prefix = cache_key(version) + "/"
    return sorted([k[len(prefix) :], size] for k, (size, _) in stat_objects(store, prefix).items())


def pull_store(
    store: ObjectStore,
    version: str,
    base: str,
    files: list[list[Any]],
    on_file: OnFile,
    on_bytes: Callable[[int], None] | None = None,
    digests: FileDigests | None = None,
) -> int:
    """Read ``files`` of ``version`` from the store into ``base``; bytes read
    (``on_bytes`` told of each whole file's size)."""
    prefix = cache_key(version)
    workers = store.workers_for(len(files), sum(int(f[1]) for f in files))

    def one(entry: list[Any]) -> int:
        rel, size = entry[0], int(entry[1])
        path, part = part_of(base, rel)
        try:
            store.download_file(f"{prefix}/{rel}", part, size)
            if os.path.getsize(part) != size:
                raise OSError(f"{rel}: {os.path.getsize(part)} bytes from the store, not {size}")
            digest = file_sha(rel, part)
            kept(part, path, rel, digest, digests)
        finally:
            if os.path.exists(part):
                os.unlink(part)
        if on_bytes is not None:
            on_bytes(size)
        on_file(rel, path, digest.hexdigest())
        return size

    with ThreadPoolExecutor(workers, thread_name_prefix="kinetic-store-get") as pool:
        return sum(pool.map(one, files))
