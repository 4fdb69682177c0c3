"""Sizes and times of stored objects, in one listing (cleanup, history, the CLI)."""

from __future__ import annotations

from airflow_provider_kinetic.core.storage.base import ObjectStore, OutsideStoreError


def stat_objects(store: ObjectStore, prefix: str) -> dict[str, tuple[int, float]]:
    """``{key: (bytes, modified epoch seconds)}`` for every object under ``prefix``.

    One listing either way: ``LocalStore.stat`` on a local store (links resolved; a
    link out of the root is not listed), blob metadata on GCS (the listing already
    carries ``size`` and ``updated``).
    """
    if store.scheme == "file":
        out: dict[str, tuple[int, float]] = {}
        for key in store.list(prefix):
            try:
                st = store.stat(key)  # type: ignore[attr-defined]  # LocalStore: links resolved
            except (FileNotFoundError, OutsideStoreError):  # removed, or relinked, since
                continue
            out[key] = (st.st_size, st.st_mtime)
        return out
    bucket = store._bucket()  # type: ignore[attr-defined]  # GcsStore only
    return {
        blob.name: (int(blob.size or 0), blob.updated.timestamp() if blob.updated else 0.0)
        for blob in bucket.list_blobs(prefix=prefix)
    }
