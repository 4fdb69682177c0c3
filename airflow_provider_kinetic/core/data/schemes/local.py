"""Local data: a path on the submitting machine, or the same as a ``file://`` URI.

Its content is hashed with kinetic's content hash and uploaded once to the data
cache; the ref points at the cache entry.  ``file://`` exists so that an earlier
task's ``output_dir`` XCom on the local backend (``file:///.../outputs/...``) can be
passed to ``Data`` as it is.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.data.schemes.base import (
    Data,
    DataScheme,
    download_from_store,
    plain_ref,
)
from airflow_provider_kinetic.core.storage import ObjectStore


class LocalPathScheme(DataScheme):
    """A plain path (``~`` expanded, made absolute)."""

    name = "local"
    uploads = True

    def local_path(self, data: Data) -> str:
        return os.path.abspath(os.path.expanduser(data.path))

    def validate(self, data: Data) -> None:
        path = self.local_path(data)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"Data path {data.path!r} does not exist (resolved to {path!r})"
            )

    def is_dir(self, data: Data) -> bool:
        return os.path.isdir(self.local_path(data))

    def ref(
        self, data: Data, store: ObjectStore, mount: str | None
    ) -> tuple[dict[str, Any], FuseMount | None]:
        uri, is_dir = store.uri(cache_key(data.content_hash())), self.is_dir(data)
        if not data.fuse:
            return plain_ref(data, uri, is_dir, mount), None
        if store.scheme == "file":
            # Local backend: FUSE data is served read-only straight from the cache dir.
            return plain_ref(data, uri, is_dir, mount or uri[len("file://") :]), None
        target = uri if is_dir else f"{uri}/{os.path.basename(self.local_path(data))}"
        return plain_ref(data, uri, is_dir, mount), FuseMount(
            target + ("/" if is_dir else ""), mount or "", is_dir
        )


class FileUriScheme(LocalPathScheme):
    """``file:///abs/path``: a local path written as a URI (the local backend's
    output dirs); hashed and uploaded like any local path."""

    name = "file"

    def local_path(self, data: Data) -> str:
        parsed = urllib.parse.urlsplit(data.path)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(
                f"Data URI {data.path!r} must be file:///absolute/path (no host, absolute path)"
            )
        return urllib.parse.unquote(parsed.path)

    def validate(self, data: Data) -> None:
        self.local_path(data)
        super().validate(data)

    def materialise(self, ref: dict[str, Any], target: str) -> str:
        return download_from_store(ref, target)

    def local_source(self, ref: dict[str, Any]) -> str | None:
        """The read-only cache entry itself: volumes link to it (shared by all jobs)."""
        return urllib.parse.unquote(urllib.parse.urlsplit(ref["uri"]).path)
