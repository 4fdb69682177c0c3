"""The wire form of ``Data``: kinetic's ref dict, the cache keys refs point at, and the
walk that swaps Data for refs.

A resolved ``Data`` travels to the function as a plain dict (``make_data_ref``); the
client replaces Data with refs and the runner replaces refs with local paths, both
through :func:`map_leaves`.  Nothing here knows schemes or stores: the runner and
every scheme use it.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "CACHE_PREFIX",
    "EMPTY_DIRS",
    "EMPTY_TREE_HASH",
    "FILES_PREFIX",
    "TREES_PREFIX",
    "entry_key",
    "file_key",
    "layout_for",
    "tree_hash",
    "tree_key",
    "KEEP",
    "MARKER_PREFIX",
    "cache_hash",
    "cache_key",
    "is_data_ref",
    "make_data_ref",
    "map_leaves",
    "marker_key",
]

#: ``map_leaves`` sentinel: "not a leaf I replace".
KEEP = object()
#: kinetic's data cache: content at ``{CACHE_PREFIX}/{hash}/``, and an empty marker at
#: ``{MARKER_PREFIX}/{hash}`` written last (present = complete).  A local Data's ref
#: points at its cache entry.
CACHE_PREFIX = "default/data-cache"
MARKER_PREFIX = "default/data-markers"
#: The incremental layout (``core/data/incremental.py``): one object per distinct file
#: content, named by the SHA-256 of its bytes, shared by every tree and version that
#: holds those bytes; and per content hash a manifest naming each file's object.
FILES_PREFIX = "default/data-files"
TREES_PREFIX = "default/data-trees"
#: ``data_layout`` connection values: ours (incremental) and kinetic's per-tree one.
FILES_LAYOUT = "files"
KINETIC_LAYOUT = "kinetic"
DATA_LAYOUTS = (FILES_LAYOUT, KINETIC_LAYOUT)
#: Our additive ref key (kinetic's runner ignores it): a directory Data's empty
#: directories, ``["a/b", ...]`` relative to it.  Empty directories do not change
#: kinetic's hash, so trees that differ only in them share one cache entry, which
#: holds files only; each ref carries its own, and the runner makes them.
EMPTY_DIRS = "empty_dirs"
#: kinetic's hash of a directory with no file at all (its cache entry has no object).
EMPTY_TREE_HASH = hashlib.sha256(b"dir:").hexdigest()


def cache_key(content_hash: str) -> str:
    return f"{CACHE_PREFIX}/{content_hash}"


def marker_key(content_hash: str) -> str:
    return f"{MARKER_PREFIX}/{content_hash}"


def file_key(sha256_hex: str) -> str:
    """One file's content object (the SHA-256 of its bytes alone)."""
    return f"{FILES_PREFIX}/{sha256_hex}"


def tree_key(content_hash: str) -> str:
    """The manifest of a content hash (incremental layout)."""
    return f"{TREES_PREFIX}/{content_hash}.json"


def layout_for(store: Any, fuse: bool, layout: str | None = None) -> str:
    """The layout a local Data is stored in: ``layout`` when given, else the store's
    (``ObjectStore.data_layout``, from the connection); on a bucket a ``fuse=True``
    Data is always kinetic's per-tree entry (a FUSE mount needs the tree as a prefix).
    A local store keeps a per-tree entry dir in both (hard links in ``files``)."""
    if layout is not None:
        return layout
    if getattr(store, "scheme", "file") != "file" and fuse:
        return KINETIC_LAYOUT
    return getattr(store, "data_layout", FILES_LAYOUT)


def entry_key(store: Any, content_hash: str, fuse: bool) -> str:
    """The key a local Data's ref names: the manifest for the incremental layout on a
    bucket, else the per-tree cache entry (kinetic's)."""
    if getattr(store, "scheme", "file") != "file" and layout_for(store, fuse) == FILES_LAYOUT:
        return tree_key(content_hash)
    return cache_key(content_hash)


def tree_hash(uri: str) -> str | None:
    """The content hash a manifest URI or key names, else None."""
    head, sep, tail = uri.rpartition(f"{TREES_PREFIX}/")
    digest = tail.removesuffix(".json")
    if not sep or not tail.endswith(".json") or len(digest) != 64:
        return None
    return digest if all(c in "0123456789abcdef" for c in digest) else None


def cache_hash(uri: str) -> str | None:
    """The content hash of a ref URI that names a data-cache entry or a manifest (a
    local Data or a ``kinetic://`` key), else None: what a job holds, for ``data gc``."""
    head, sep, tail = uri.rstrip("/").rpartition(f"{CACHE_PREFIX}/")
    if sep and tail and "/" not in tail:
        return tail
    return tree_hash(uri)


def make_data_ref(
    uri: str,
    is_dir: bool,
    mount_path: str | None = None,
    fuse: bool = False,
    hf_trust_remote_code: bool = False,
    empty_dirs: list[str] | None = None,
) -> dict[str, Any]:
    """The wire form of a resolved ``Data`` (kinetic's ref dict; ``empty_dirs`` is
    added only when there are some, so other refs stay exactly kinetic's)."""
    ref = {
        "__data_ref__": True,
        "uri": uri,
        "is_dir": is_dir,
        "mount_path": mount_path,
        "fuse": fuse,
        "hf_trust_remote_code": hf_trust_remote_code,
    }
    if empty_dirs:
        ref[EMPTY_DIRS] = list(empty_dirs)
    return ref


def is_data_ref(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("__data_ref__") is True


def map_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """Rebuild list/tuple/dict containers with ``leaf(x)`` applied where it answers.

    ``leaf`` returns ``KEEP`` for values it does not replace (containers are then
    walked).  A container in which nothing changed is returned as it is (aliasing
    preserved); subclasses (NamedTuple, OrderedDict, defaultdict) keep their type.
    Used for Data -> ref on the client and ref -> path in the runner.
    """
    new = leaf(obj)
    if new is not KEEP:
        return new
    if isinstance(obj, dict):
        items = {k: map_leaves(v, leaf) for k, v in obj.items()}
        if all(items[k] is v for k, v in obj.items()):
            return obj
        if isinstance(obj, collections.defaultdict):  # its constructor wants the factory
            clone = collections.defaultdict(obj.default_factory)
            clone.update(items)
            return clone
        return type(obj)(items)
    if isinstance(obj, list | tuple):
        values = [map_leaves(v, leaf) for v in obj]
        if all(a is b for a, b in zip(values, obj, strict=True)):
            return obj
        if hasattr(obj, "_fields"):  # NamedTuple
            return type(obj)(*values)
        return type(obj)(values)
    return obj
