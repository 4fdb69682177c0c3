"""Object stores: ``gs://`` (GCS) and ``file://`` (a local directory).

``GcsStore`` is resolved lazily (module ``__getattr__``) so that importing this
package, and using ``LocalStore``, never imports google-cloud-storage: the local
backend and most of Airflow's parsing path do not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_kinetic.core.storage.base import (
    ObjectNotFound,
    ObjectStore,
    OutsideStoreError,
    PreconditionFailed,
    ProgressFn,
    StoreFullError,
    StoreUnavailable,
)
from airflow_provider_kinetic.core.storage.fileuri import file_uri, file_uri_path
from airflow_provider_kinetic.core.storage.local import LocalStore

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

__all__ = [
    "GcsStore",
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "OutsideStoreError",
    "PreconditionFailed",
    "ProgressFn",
    "StoreFullError",
    "StoreUnavailable",
    "file_uri",
    "file_uri_path",
    "split_gs_uri",
    "store_for_uri",
]

#: Schemes ``store_for_uri`` understands.
SCHEMES = ("gs", "file")


def __getattr__(name: str) -> Any:
    if name == "GcsStore":
        from airflow_provider_kinetic.core.storage.gcs import GcsStore

        return GcsStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def split_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``; ``gs://bucket`` -> ``("bucket", "")``."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, key = uri[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"gs:// URI has no bucket: {uri!r}")
    return bucket, key


def store_for_uri(uri: str) -> tuple[ObjectStore, str]:
    """The store holding ``uri`` and the key within it.

    ``gs://bucket/a/b`` -> ``(GcsStore("bucket"), "a/b")``;
    ``file:///x/y/z`` -> ``(LocalStore("/"), "x/y/z")`` (rooted at ``/`` so that any
    absolute path is a key, and ``store.uri(key)`` gives back the URI in its encoded
    form).  A ``file://`` URI is percent-decoded (``fileuri.py``: the one rule).
    """
    scheme, sep, _ = uri.partition("://")
    if sep and scheme == "gs":
        from airflow_provider_kinetic.core.storage.gcs import GcsStore

        bucket, key = split_gs_uri(uri)
        return GcsStore(bucket), key
    if sep and scheme == "file":
        return LocalStore("/"), file_uri_path(uri).lstrip("/")
    allowed = ", ".join(f"{s}://" for s in SCHEMES)
    raise ValueError(f"unsupported object-store URI {uri!r}; expected one of: {allowed}")
