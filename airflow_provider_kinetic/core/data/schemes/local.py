"""Local data: a path on the submitting machine, or the same as a ``file://`` URI.

Its content is hashed with kinetic's content hash and uploaded once to the data
cache; the ref points at the cache entry.  ``file://`` exists so that an earlier
task's ``output_dir`` XCom on the local backend (``file:///.../outputs/...``) can be
passed to ``Data`` as it is; it is read by the one ``file://`` rule the store writes
by (``core/storage/fileuri.py``: percent-encoded), so the two name the same path.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.data.refs import EMPTY_DIRS, EMPTY_TREE_HASH, entry_key
from airflow_provider_kinetic.core.data.schemes.base import (
    Data,
    DataScheme,
    plain_ref,
)
from airflow_provider_kinetic.core.data.schemes.download import download_from_store
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path

log = logging.getLogger(__name__)


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
        """The ref points at the cache entry (files only: the entry is shared by every
        tree with the same hash, which empty directories do not change); the Data's own
        empty directories travel in the ref (``empty_dirs``) and the runner makes them."""
        digest = data.content_hash()
        uri, is_dir = store.uri(entry_key(store, digest, data.fuse)), self.is_dir(data)
        empty = data.empty_dirs() if is_dir else []
        if not data.fuse:
            return plain_ref(data, uri, is_dir, mount, empty), None
        if store.scheme == "file":
            # Local backend: FUSE data is served read-only straight from the cache dir
            # when that dir is the whole Data; with empty dirs (or no file at all: no
            # cache dir) the runner makes a copy that has them.
            exact = not empty and digest != EMPTY_TREE_HASH
            local = mount or (file_uri_path(uri) if exact else None)
            return plain_ref(data, uri, is_dir, local, empty), None
        if empty:
            log.warning(
                "Data(%r, fuse=True): its %d empty director%s (%s) are not visible through "
                "a GCS FUSE mount (the cache holds files only); use fuse=False to get them",
                data.path,
                len(empty),
                "y" if len(empty) == 1 else "ies",
                ", ".join(empty[:3]),
            )
        target = uri if is_dir else f"{uri}/{os.path.basename(self.local_path(data))}"
        return plain_ref(data, uri, is_dir, mount, empty), FuseMount(
            target + ("/" if is_dir else ""), mount or "", is_dir
        )


class FileUriScheme(LocalPathScheme):
    """``file:///abs/path``: a local path written as a URI (the local backend's
    output dirs); hashed and uploaded like any local path."""

    name = "file"

    def local_path(self, data: Data) -> str:
        """The path the URI names, percent-decoded (the one ``file://`` rule)."""
        try:
            return file_uri_path(data.path)
        except ValueError:
            raise ValueError(
                f"Data URI {data.path!r} must be file:///absolute/path (no host, absolute path)"
            ) from None

    def validate(self, data: Data) -> None:
        self.local_path(data)
        super().validate(data)

    def materialise(self, ref: dict[str, Any], target: str) -> str:
        return download_from_store(ref, target)

    def local_source(self, ref: dict[str, Any]) -> str | None:
        """The read-only cache entry itself (volumes link to it, shared by all jobs),
        when it is the whole Data: not when the Data has empty directories (the entry
        holds files only) or no file at all (then there is no entry directory)."""
        path = file_uri_path(ref["uri"])
        if ref.get(EMPTY_DIRS) or not os.path.isdir(path):
            return None
        return path
