"""``Data``: a local path or ``gs://`` URI that the remote function receives as a path.

Local data is content-addressed with kinetic 0.0.4's exact hash so that a kinetic
user's data cache (``default/data-cache/{hash}``) is reused by our jobs and vice
versa.  The hash is computed once per instance (snapshot semantics, as kinetic).
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.schemes import DataScheme

#: ``map_leaves`` sentinel: "not a leaf I replace".
KEEP = object()

_CHUNK = 256 * 1024
#: Below this many files hashing stays sequential (thread start-up costs more).
_PARALLEL_THRESHOLD = 16
_BATCH = 512
_PARALLEL_MIN_BYTES = 32 * 1024 * 1024


def _file_digest(path: str, relpath: str) -> bytes:
    """Raw SHA-256 of ``relpath`` + NUL + file bytes (kinetic's per-file digest)."""
    h = hashlib.sha256()
    h.update(relpath.encode("utf-8"))
    h.update(b"\0")
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.digest()


def iter_tree(root: str) -> Iterator[tuple[str, str]]:
    """Yield ``(abs_path, relpath)`` in kinetic's order.

    ``os.walk`` top-down without following directory symlinks, directories sorted in
    place and files sorted per directory: a directory's files come before its
    subdirectories.  Symlinked files are included (their target's content).
    """
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not os.path.isfile(path):
                continue  # broken link, or a link to a directory: nothing to hash
            yield path, os.path.relpath(path, root)


def _digests_parallel(files: list[tuple[str, str]]) -> Iterator[bytes]:
    """Digests in submission order, bounded to 2x workers batches in flight."""
    workers = min(32, (os.cpu_count() or 1) + 4)
    # Small batches for few (large) files so every worker gets some; at most _BATCH.
    size = max(1, min(_BATCH, len(files) // (workers * 4)))
    batches = [files[i : i + size] for i in range(0, len(files), size)]

    def run(batch: list[tuple[str, str]]) -> list[bytes]:
        return [_file_digest(p, r) for p, r in batch]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending = []
        for batch in batches:
            pending.append(pool.submit(run, batch))
            if len(pending) >= 2 * workers:
                yield from pending.pop(0).result()
        for fut in pending:
            yield from fut.result()


def content_hash_of(path: str) -> str:
    """kinetic 0.0.4's content hash of a local file or directory (hex)."""
    if os.path.isfile(path):
        digest = _file_digest(path, os.path.basename(path))
        return hashlib.sha256(b"file:" + digest).hexdigest()
    files = list(iter_tree(path))
    combined = hashlib.sha256(b"dir:")
    # Threads pay off only when there are bytes to hash: many small files hash
    # faster in one thread (measured in benchmarks/run.py).
    parallel = len(files) > _PARALLEL_THRESHOLD and (
        sum(os.path.getsize(p) for p, _ in files) > _PARALLEL_MIN_BYTES
    )
    digests = _digests_parallel(files) if parallel else (_file_digest(p, r) for p, r in files)
    for d in digests:
        combined.update(d)
    return combined.hexdigest()


class Data:
    """A reference to data the remote function needs, resolved to a local path there.

    Args:
        path: a local file or directory (``~`` expanded, made absolute; it must exist
            when the job is submitted), a ``file:///abs/path`` URI (e.g. an earlier
            task's ``output_dir`` on the local backend), a ``gs://`` URI (trailing
            ``/`` = directory), or ``hf://org/name?split=&config_name=&revision=``
            (a Hugging Face dataset, always a directory).  Airflow renders Jinja in
            the path before the existence check, so ``Data("/data/{{ ds }}/")`` works
            as an operator argument.
        fuse: mount through the GCS FUSE CSI driver instead of downloading.
        hf_trust_remote_code: passed to ``datasets.load_dataset`` for ``hf://`` data.
    """

    # Lets Airflow's templater render ``path`` when Data sits inside op_kwargs.
    template_fields = ("path",)

    def __init__(self, path: str, fuse: bool = False, hf_trust_remote_code: bool = False):
        if not isinstance(path, str | os.PathLike) or not str(path):
            raise TypeError(f"Data path must be a non-empty str or os.PathLike, got {path!r}")
        self.path = os.fspath(path)
        self.fuse = bool(fuse)
        self.hf_trust_remote_code = bool(hf_trust_remote_code)
        self._hash: str | None = None
        self._lock = threading.Lock()

    # ---- classification (delegated to the Data scheme registry) -----------------
    @property
    def scheme(self) -> DataScheme:
        """The scheme that owns this path (local path, ``file://``, ``gs://``, ``hf://``)."""
        from airflow_provider_kinetic.core.schemes import scheme_for

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
        """kinetic-compatible content hash of local data (cached per instance)."""
        if not self.uploads:
            raise ValueError(f"content_hash() applies to local data only, not {self.path!r}")
        if self._hash is None:
            with self._lock:
                if self._hash is None:
                    self.validate()
                    self._hash = content_hash_of(self.local_path)
        return self._hash

    # ---- pickling / repr ------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
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


def make_data_ref(
    uri: str,
    is_dir: bool,
    mount_path: str | None = None,
    fuse: bool = False,
    hf_trust_remote_code: bool = False,
) -> dict[str, Any]:
    """The wire form of a resolved ``Data`` (kinetic's ref dict)."""
    return {
        "__data_ref__": True,
        "uri": uri,
        "is_dir": is_dir,
        "mount_path": mount_path,
        "fuse": fuse,
        "hf_trust_remote_code": hf_trust_remote_code,
    }


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
