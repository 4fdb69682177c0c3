"""The Data scheme contract: how one kind of ``Data`` path travels to the function.

A scheme answers four questions about a ``Data`` whose path it owns:

- ``validate``: is it usable (called before anything is uploaded)?
- ``uploads``: is its content hashed and uploaded to the data cache (local data), or
  passed through by reference (``gs://``, ``hf://``)?
- ``ref``: its wire ref (kinetic's ref dict) on the client, plus a FUSE mount if any;
- ``materialise``: in the runner, put a ref's content at a local path (a directory
  ref's path always exists, with the empty directories its ref lists).

Schemes are Airflow-free: the runner uses them in the pod.
"""

from __future__ import annotations

import abc
import os
from typing import Any, ClassVar, Protocol

from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.data.refs import EMPTY_DIRS, make_data_ref
from airflow_provider_kinetic.core.storage import ObjectStore


class Data(Protocol):
    """What a scheme reads of a ``Data`` (``core/data/value.py`` defines the class,
    which finds its scheme here: schemes see it through this interface only)."""

    path: str
    fuse: bool
    hf_trust_remote_code: bool

    def content_hash(self) -> str: ...

    def empty_dirs(self) -> list[str]: ...


class DataScheme(abc.ABC):
    """One URI scheme of ``Data`` paths (or plain local paths)."""

    #: Registry key and the URI prefix it owns (``"gs"`` owns ``gs://...``).
    name: ClassVar[str]
    #: Content is hashed and uploaded to ``default/data-cache/{hash}``.
    uploads: ClassVar[bool] = False

    @abc.abstractmethod
    def validate(self, data: Data) -> None:
        """Raise ``ValueError``/``FileNotFoundError`` naming the path when unusable."""

    @abc.abstractmethod
    def is_dir(self, data: Data) -> bool:
        """Whether the function receives a directory."""

    def local_path(self, data: Data) -> str:
        """The local file or directory whose content is uploaded (``uploads`` only)."""
        raise ValueError(f"{data.path!r} is not local data: it has no local path")

    @abc.abstractmethod
    def ref(
        self, data: Data, store: ObjectStore, mount: str | None
    ) -> tuple[dict[str, Any], FuseMount | None]:
        """The wire ref for ``data`` (nothing uploaded) and its FUSE mount, if any."""

    def materialise(self, ref: dict[str, Any], target: str) -> str:
        """Runner side: make a ref whose ``uri`` has this scheme a local path under
        ``target``; returns the path the function receives."""
        raise ValueError(f"a {self.name}:// data ref cannot be materialised: {ref['uri']!r}")

    def local_source(self, ref: dict[str, Any]) -> str | None:
        """Runner side: the path on this machine that already holds the ref's content
        (a local store's cache entry), so a volume can be a link to it; else None."""
        return None

    def as_directory(self, uri: str) -> str:
        """``uri`` spelled so that ``Data(uri)`` is a directory (an output dir XCom)."""
        return uri


def plain_ref(
    data: Data, uri: str, is_dir: bool, mount: str | None, empty_dirs: list[str] | None = None
) -> dict[str, Any]:
    """A ref with ``data``'s flags."""
    return make_data_ref(uri, is_dir, mount, data.fuse, data.hf_trust_remote_code, empty_dirs)


def create_empty_dirs(ref: dict[str, Any], target: str) -> None:
    """Make a directory ref's ``target`` and the empty directories its ref lists (an
    empty Data's cache entry has no object, and a store keeps no empty directory).
    A listed path that is absolute or climbs out (``..``) is refused."""
    if not ref.get("is_dir"):
        return
    os.makedirs(target, exist_ok=True)
    for rel in ref.get(EMPTY_DIRS) or ():
        parts = [p for p in str(rel).split("/") if p not in ("", ".")]
        if str(rel).startswith("/") or ".." in parts or not parts:
            raise ValueError(f"data ref {ref['uri']!r}: bad empty directory {rel!r}")
        os.makedirs(os.path.join(target, *parts), exist_ok=True)
