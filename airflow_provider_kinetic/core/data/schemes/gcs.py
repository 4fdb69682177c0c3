"""``gs://bucket/prefix`` data: passed through by reference, never hashed or uploaded.

A trailing ``/`` means a directory (kinetic's rule).  ``fuse=True`` mounts it with the
GCS FUSE CSI driver instead of downloading.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.data.schemes.base import (
    Data,
    DataScheme,
    plain_ref,
)
from airflow_provider_kinetic.core.data.schemes.download import download_from_store
from airflow_provider_kinetic.core.storage import ObjectStore


class GcsScheme(DataScheme):
    name = "gs"

    def validate(self, data: Data) -> None:
        if len(data.path) <= len("gs://") or data.path[5:].startswith("/"):
            raise ValueError(f"Data URI {data.path!r} has no bucket name")

    def is_dir(self, data: Data) -> bool:
        return data.path.endswith("/")

    def ref(
        self, data: Data, store: ObjectStore, mount: str | None
    ) -> tuple[dict[str, Any], FuseMount | None]:
        is_dir = self.is_dir(data)
        ref = plain_ref(data, data.path.rstrip("/"), is_dir, mount)
        if not data.fuse:
            return ref, None
        return ref, FuseMount(data.path, mount or "", is_dir)

    def materialise(self, ref: dict[str, Any], target: str) -> str:
        return download_from_store(ref, target)

    def as_directory(self, uri: str) -> str:
        """A trailing ``/`` is what makes a gs:// Data a directory (kinetic's rule)."""
        return uri if uri.endswith("/") else uri + "/"
