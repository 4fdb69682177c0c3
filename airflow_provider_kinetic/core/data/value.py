"""``Data``: a local path or URI that the remote function receives as a path.

Local data is content-addressed with kinetic 0.0.4's exact hash so that a kinetic
user's data cache (``default/data-cache/{hash}``) is reused by our jobs and vice
versa.  The hash is computed once per instance (snapshot semantics, as kinetic), by
``core/data/hashing/treehash.py``, which skips re-reading files a per-machine stat cache
(``core/data/hashing/statcache.py``) vouches for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from airflow_provider_kinetic.core.data.hashing.statcache import StatCache
from airflow_provider_kinetic.core.data.hashing.treehash import TreeHash
from airflow_provider_kinetic.core.data.hashing.treehash import content_hash as _tree_hash
from airflow_provider_kinetic.core.data.hashing.treewalk import scan_tree
from airflow_provider_kinetic.core.data.schemes import DataScheme, scheme_for

__all__ = ["Data", "content_hash_of", "content_hash_tree", "iter_tree"]

#: ``stat_cache`` default: the machine's cache (``statcache.default_dir()``).
DEFAULT_CACHE: Any = object()


def _resolve_cache(stat_cache: StatCache | str | None) -> StatCache | None:
    if stat_cache is DEFAULT_CACHE:
        return StatCache.default()
    if isinstance(stat_cache, str | os.PathLike):
        return StatCache(os.fspath(stat_cache))
    return stat_cache


def iter_tree(root: str) -> Iterator[tuple[str, str]]:
    """Yield ``(abs_path, relpath)`` of the files of ``root`` in kinetic's order.

    ``os.walk`` order: directories sorted, a directory's files (sorted) before its
    subdirectories.  Symlinked files are included (their target's content); a
    symlinked directory, a dangling link, a FIFO, socket or device raises
    ``DataPathError``.
    """
    base = root if root.endswith(os.sep) else root + os.sep
    for scan in scan_tree(root, root):
        for name in scan.names:
            yield base + scan.rel + name, scan.rel + name


def content_hash_tree(
    path: str, *, label: str | None = None, stat_cache: Any = DEFAULT_CACHE
) -> TreeHash:
    """kinetic 0.0.4's content hash of a local file or directory, with its file list.

    ``stat_cache``: a :class:`StatCache`, a directory for one, ``None`` (hash every
    byte), or the machine's default cache.
    """
    path = os.path.abspath(os.path.expanduser(path))
    return _tree_hash(path, label or path, _resolve_cache(stat_cache))


def content_hash_of(path: str, *, stat_cache: Any = DEFAULT_CACHE) -> str:
    """kinetic 0.0.4's content hash of a local file or directory (hex)."""
    return content_hash_tree(path, stat_cache=stat_cache).hexdigest


class Data:
    """A reference to data the remote function needs, resolved to a local path there.

    Args:
        path: a local file or directory (``~`` expanded, made absolute; it must exist
            when the job is submitted), a ``file:///abs/path`` URI (e.g. an earlier
            task's ``output_dir`` on the local backend), a ``gs://`` URI (trailing
            ``/`` = directory), or ``hf://org/name?split=&config_name=&revision=``
            (a Hugging Face dataset, always a directory).  Airflow renders Jinja in
            the path before the existence check, so ``Data("/data/{{ ds }}/")`` works
            as an operator argument.  An Airflow ``Asset`` (any object with a string
            ``uri``: also an asset event's ``asset``) stands for its URI; the operator
            makes it one of the task's inlets (``Data.asset``).
        fuse: mount through the GCS FUSE CSI driver instead of downloading.
        hf_trust_remote_code: passed to ``datasets.load_dataset`` for ``hf://`` data.
        directory: the path names a directory.  Needed for a ``gs://`` asset: Airflow
            strips the trailing ``/`` from every asset URI, and without it a gs:// URI
            is one object.  Only for a literal path (end a templated one with ``/``).
    """

    # Lets Airflow's templater render ``path`` when Data sits inside op_kwargs.
    template_fields = ("path",)

    def __init__(
        self,
        path: str | Any,
        fuse: bool = False,
        hf_trust_remote_code: bool = False,
        *,
        directory: bool = False,
    ):
        # Duck-typed, so core never imports Airflow: an Asset (os.PathLike too) or an
        # asset event's ``asset`` (not PathLike) is known by its string ``uri``.
        asset_uri = getattr(path, "uri", None)
        self._asset = path if isinstance(asset_uri, str) and not isinstance(path, str) else None
        if self._asset is not None:
            path = asset_uri
        if not isinstance(path, str | os.PathLike) or not str(path):
            raise TypeError(f"Data path must be a non-empty str or os.PathLike, got {path!r}")
        self.path = os.fspath(path)
        if directory:
            if "{{" in self.path or "{%" in self.path:
                raise ValueError(
                    f"Data({self.path!r}, directory=True): a templated path is a directory "
                    "when it ends with '/' (directory=True needs a literal path)"
                )
            self.path = scheme_for(self.path).as_directory(self.path)
        self.fuse = bool(fuse)
        self.hf_trust_remote_code = bool(hf_trust_remote_code)
        self._hash: str | None = None
        self._tree: TreeHash | None = None
        self._lock = threading.Lock()

    @property
    def asset(self) -> Any:
        """The Airflow asset this Data was made from (None: a path or URI).  Kept in
        this process only: it is not pickled (a pod has no Airflow to load it)."""
        return getattr(self, "_asset", None)

    # ---- classification (delegated to the Data scheme registry) -----------------
    @property
    def scheme(self) -> DataScheme:
        """The scheme that owns this path (local path, ``file://``, ``gs://``, ``hf://``)."""
        return scheme_for(self.path)

    @property
    def uploads(self) -> bool:
        """Whether the content is hashed and uploaded (local data) or passed by reference."""
        return self.scheme.uploads

    @property
    def local_path(self) -> str:
        """Absolute local path of local data (``~`` expanded, ``file://`` decoded)."""
        return self.scheme.local_path(self)

    @property
    def is_dir(self) -> bool:
        return self.scheme.is_dir(self)

    def validate(self) -> None:
        """Raise naming the path when the data cannot be used (missing local path,
        unknown scheme, bad URI).  Called at submit time, after template rendering,
        before anything is uploaded."""
        self.scheme.validate(self)

    def content_hash(self) -> str:
        """kinetic-compatible content hash of local data (cached per instance).

        A FIFO, socket or device in (or as) the path raises ``DataPathError``, an
        unreadable file ``DataReadError``, both naming this Data's path.
        """
        if not self.uploads:
            raise ValueError(f"content_hash() applies to local data only, not {self.path!r}")
        if self._hash is None:
            with self._lock:
                if self._hash is None:
                    self.validate()
                    tree = content_hash_tree(self.local_path, label=self.path)
                    self._tree, self._hash = tree, tree.hexdigest
        return self._hash

    def hashed_files(self) -> tuple[str, list[tuple[str, int]]]:
        """``(root, [(relpath, size), ...])``: the files ``content_hash`` covered, for
        the upload (so it sends exactly what was hashed).  An unpickled instance that
        kept only its hash lists the path again."""
        tree = self._hashed_tree()
        if tree is None:
            path = self.local_path
            return os.path.dirname(path), [(os.path.basename(path), os.path.getsize(path))]
        return tree.root, tree.files()

    def hashed_stats(self) -> dict[str, tuple[int, ...]]:
        """``relpath -> (ino, size, mtime_ns, ctime_ns)`` of each file as
        ``content_hash`` saw it (empty for an unpickled single file): what tells a
        file changed since (``core.data.cache`` names it)."""
        tree = self._hashed_tree()
        if tree is None:
            return {}
        return {
            d.rel + n: tuple(sig[:4])
            for d in tree.scans
            for n, sig in zip(d.names, d.sigs, strict=True)
        }

    def empty_dirs(self) -> list[str]:
        """The empty directories of a directory Data (``"a/b"``, relative to it), from
        the same walk as ``content_hash``: they do not change kinetic's hash, so the
        ref carries them (``core/data/refs.py``) and the job gets them too."""
        tree = self._hashed_tree()
        return [] if tree is None or not self.is_dir else tree.empty_dirs()

    def _hashed_tree(self) -> TreeHash | None:
        """The walk ``content_hash`` made (a directory walked again for an unpickled
        instance that kept only its hash); None for a single file walked no more."""
        self.content_hash()
        tree: TreeHash | None = getattr(self, "_tree", None)
        if tree is None:
            with self._lock:
                path = self.local_path
                if os.path.isdir(path):
                    tree = TreeHash(self._hash or "", path, scan_tree(path, self.path))
                    self._tree = tree
        return tree

    # ---- pickling / repr ------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state.pop("_tree", None)  # the file list is local to this machine and large
        state.pop("_asset", None)  # an Airflow object: inlets were taken at parse time
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        extra = ", fuse=True" if self.fuse else ""
        return f"Data({self.path!r}{extra})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Data) and (self.path, self.fuse, self.hf_trust_remote_code) == (
            other.path,
            other.fuse,
            other.hf_trust_remote_code,
        )

    def __hash__(self) -> int:
        return hash((self.path, self.fuse))
