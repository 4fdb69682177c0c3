"""``kinetic://KEY`` and ``kinetic://KEY@VERSION`` data: a key of the store, by name.

A key's version is a data-cache entry already (``default/data-cache/{hash}``, put by
``store.put`` or ``output_key``), so nothing is hashed or uploaded: the ref points at
that entry exactly as a local ``Data`` of the same content would, and the runner
downloads and verifies it as it does any cache entry (it gets a plain local path).

Why a resolver is *given* to this scheme instead of imported: keys live above data in
the layers (``core/keys`` hashes and uploads through ``Data``), so this module cannot
import them.  ``core/keys/resolve.py`` installs the resolver when it is imported, and
the job packer (``core/jobs/pack.py``) imports it, so every submit has it.  The same
inversion as schemes seeing ``Data`` through a protocol (``base.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.data.refs import EMPTY_TREE_HASH, cache_key
from airflow_provider_kinetic.core.data.schemes.base import Data, DataScheme, plain_ref
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path

PREFIX = "kinetic://"


@dataclass(frozen=True)
class KeyTarget:
    """What one key version is, as the ref needs it."""

    key: str
    version: str
    is_dir: bool
    #: A file key's one file name (its cache entry holds that file).
    name: str = ""
    empty_dirs: list[str] = field(default_factory=list)


class KeyResolver(Protocol):
    """The key store's side (``core/keys/resolve.py``)."""

    def check(self, ref: str) -> None:
        """Raise ``ValueError`` naming ``ref`` (``key`` or ``key@version``) when it is
        not of the key form; reads nothing."""

    def target(self, store: ObjectStore, ref: str) -> KeyTarget:
        """The version ``ref`` names in ``store`` (current, or pinned), whose content
        is in the data cache; ``LookupError`` naming the key and the nearest keys."""


def key_ref(path: str) -> str:
    """``kinetic://models/churn@ab12`` -> ``models/churn@ab12``."""
    return path[len(PREFIX) :] if path.startswith(PREFIX) else path


class KineticKeyScheme(DataScheme):
    """Keys of the job's own store (the connection's bucket or local root)."""

    name = "kinetic"
    resolver: ClassVar[KeyResolver | None] = None
    #: Resolutions seen by ``ref`` (the path -> its target), so ``is_dir`` answers for
    #: a Data that was packed; before that a key's kind is unknown without a store.
    _seen: ClassVar[dict[str, KeyTarget]] = {}

    @classmethod
    def install(cls, resolver: KeyResolver) -> None:
        cls.resolver = resolver

    def _resolver(self) -> KeyResolver:
        if self.resolver is None:  # only a caller that packs without core.jobs
            raise ValueError(
                "kinetic:// Data needs the key store: import airflow_provider_kinetic.core.keys"
                ".resolve (the job packer does) before packing it"
            )
        return self.resolver

    def validate(self, data: Data) -> None:
        self._resolver().check(key_ref(data.path))

    def is_dir(self, data: Data) -> bool:
        """A packed key's kind; True before (most keys are directories)."""
        seen = self._seen.get(data.path)
        return True if seen is None else seen.is_dir

    def ref(
        self, data: Data, store: ObjectStore, mount: str | None
    ) -> tuple[dict[str, Any], FuseMount | None]:
        """The ref of the version's cache entry, as ``LocalPathScheme`` makes it for
        the same content (so the runner treats both alike)."""
        target = self._resolver().target(store, key_ref(data.path))
        self._seen[data.path] = target
        uri = store.uri(cache_key(target.version))
        empty = list(target.empty_dirs) if target.is_dir else []
        if not data.fuse:
            return plain_ref(data, uri, target.is_dir, mount, empty), None
        if store.scheme == "file":
            exact = not empty and target.version != EMPTY_TREE_HASH
            local = mount or (file_uri_path(uri) if exact else None)
            return plain_ref(data, uri, target.is_dir, local, empty), None
        entry = uri if target.is_dir else f"{uri}/{target.name}"
        return plain_ref(data, uri, target.is_dir, mount, empty), FuseMount(
            entry + ("/" if target.is_dir else ""), mount or "", target.is_dir
        )
