"""Sizes and times of stored objects, in one listing (cleanup, history, the CLI)."""

from __future__ import annotations

import os

from airflow_provider_kinetic.core.storage.base import ObjectStore
from airflow_provider_kinetic.core.storage.fileuri import file_uri_path


def stat_objects(store: ObjectStore, prefix: str) -> dict[str, tuple[int, float]]:
    """``{key: (bytes, modified epoch seconds)}`` for every object under ``prefix``.

    One listing either way: ``os.stat`` on a local store, blob metadata on GCS (the
    listing already carries ``size`` and ``updated``).
    """
    if store.scheme == "file":
        out: dict[str, tuple[int, float]] = {}
        for key in store.list(prefix):
            try:
                st = os.stat(file_uri_path(store.uri(key)))
            except FileNotFoundError:  # removed since the listing
                continue
            out[key] = (st.st_size, st.st_mtime)
        return out
    bucket = store._bucket()  # type: ignore[attr-defined]  # GcsStore only
    return {
        blob.name: (int(blob.size or 0), blob.updated.timestamp() if blob.updated else 0.0)
        for blob in bucket.list_blobs(prefix=prefix)
    }
