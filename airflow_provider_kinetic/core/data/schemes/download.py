"""Runner side: a Data ref's objects at a local path, whole and verified, or nothing.

The objects are downloaded into a temp dir beside the target (``.NAME.kinetic-partial-
PID-TOKEN``), where the store checks each file against its listing (size, CRC32C:
``core/storage/gcs_transfer.py``).  A ref to a data-cache entry
(``default/data-cache/{hash}``) is then hashed with kinetic's content hash, which must
be the entry's name: an object changed in the store after the upload is caught there
even when its own checksum is consistent.  The files' digests for that hash are taken
as their bytes arrive (``FileDigests``: the same bytes the CRC32C check sees), so
only what the store could not hash on the way is read a second time.  Only then is
the temp dir renamed to the target, so a download cut short (an error, a SIGKILL)
never leaves files under the target's name; what it leaves is a partial dir whose
owner is dead, which the next download of the same target removes.  Nothing ever
reuses a partial dir.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.data.manifest import Manifest, ManifestFile
from airflow_provider_kinetic.core.data.refs import CACHE_PREFIX, MARKER_PREFIX, file_key, tree_hash
from airflow_provider_kinetic.core.data.schemes.base import create_empty_dirs
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectStore, store_for_uri
from airflow_provider_kinetic.core.storage.base import FileDigests
from airflow_provider_kinetic.core.storage.local_disk import writer_alive
from airflow_provider_kinetic.core.storage.stat import stat_objects

log = logging.getLogger(__name__)

#: Marks a download in progress (never a finished one): ``.{name}{PARTIAL}{pid}-{hex}``.
PARTIAL = ".kinetic-partial-"


class DataHashMismatch(KineticError, ValueError):
    """A data-cache entry's downloaded files do not hash to the entry's name."""


def download_from_store(ref: dict[str, Any], target: str, store: ObjectStore | None = None) -> str:
    """Copy every object under the ref's URI prefix to ``target`` (gs://, file://).

    A non-directory ref whose download produced exactly one file resolves to that
    file, as kinetic's runner does; a directory ref's ``target`` always exists, with
    its empty directories.  ``target`` appears only once every file is verified.
    ``store``: the store holding the URI's bucket (default: one made for the URI).
    """
    default, key = store_for_uri(ref["uri"].rstrip("/"))
    store = store or default
    target = os.path.abspath(target)
    tmp = _partial_dir(target)
    if tree_hash(key) is not None:  # the incremental layout: a manifest
        try:
            return _download_tree(ref, store, key, tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # A cache entry is hashed after the download: its files' digests are taken as
    # their bytes arrive (relpath as the hash will name it: the basename of a lone
    # file, the path below the entry otherwise), so only what a store could not hash
    # on the way (sliced big objects, a local copy) is read again.
    lone = not ref.get("is_dir")
    digests = (
        FileDigests(lambda rel: (rel.rsplit("/", 1)[-1] if lone else rel).encode() + b"\0")
        if expected_hash(key) is not None
        else None
    )
    try:
        names = store.download_prefix(key, tmp, digests=digests)
        os.makedirs(tmp, exist_ok=True)
        if lone and len(names) == 1:
            _check_hash(ref, store, key, os.path.join(tmp, names[0]), digests)
            _publish(tmp, target)
            path = os.path.join(target, names[0])
        else:
            create_empty_dirs(ref, tmp)
            _check_hash(ref, store, key, tmp, digests)
            _publish(tmp, target)
            path = target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("downloaded %d file(s) of %s to %s, verified", len(names), ref["uri"], target)
    return path


def _download_tree(ref: dict[str, Any], store: ObjectStore, key: str, tmp: str, target: str) -> str:
    """Assemble a manifest's tree in ``tmp`` from its file objects, each checked against
    its name (the SHA-256 of its bytes) as it is read, then the whole against
    kinetic's content hash, from the same reads; ``tmp`` becomes ``target``.  A bad
    or missing object makes the manifest go (``_unmark``): the next submit uploads
    what is missing."""
    expected = tree_hash(key) or ""
    manifest = Manifest.decode(store.read_bytes(key), store.uri(key))
    if manifest.content_hash != expected:
        raise DataHashMismatch(f"data manifest {store.uri(key)} names {manifest.content_hash}")
    lone = not ref.get("is_dir")
    known: dict[str, tuple[bytes, bytes]] = {}

    def fetch(f: ManifestFile) -> None:
        path = os.path.join(tmp, *f.rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            store.download_file(file_key(f.sha256), path, f.size)
        except Exception as exc:  # noqa: BLE001 - named below; the manifest goes
            raise DataHashMismatch(
                f"data {ref['uri']}: file object {store.uri(file_key(f.sha256))} ({f.rel}) "
                f"could not be read ({type(exc).__name__}: {exc}); not used; "
                f"{_unmark(store, key, expected)}"
            ) from exc
        prefix = (f.rel.rsplit("/", 1)[-1] if lone else f.rel).encode() + b"\0"
        raw, kin = hashlib.sha256(), hashlib.sha256(prefix)
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                raw.update(chunk)
                kin.update(chunk)
        if raw.hexdigest() != f.sha256:
            with contextlib.suppress(Exception):
                store.delete(file_key(f.sha256))  # its bytes are not its name
            raise DataHashMismatch(
                f"data {ref['uri']}: file object {store.uri(file_key(f.sha256))} ({f.rel}) "
                f"holds other bytes than its name; removed; {_unmark(store, key, expected)}"
            )
        known[path] = (prefix, kin.digest())

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(manifest.files)))) as pool:
        list(pool.map(fetch, manifest.files))
    os.makedirs(tmp, exist_ok=True)

    def lookup(path: str, prefix: bytes, _sig: Any) -> bytes | None:
        got = known.get(path)
        return got[1] if got is not None and got[0] == prefix else None

    if lone and len(manifest.files) == 1:
        name = manifest.files[0].rel
        got = content_hash(os.path.join(tmp, name), ref["uri"], None, lookup).hexdigest
    else:
        create_empty_dirs(ref, tmp)
        got = content_hash(tmp, ref["uri"], None, lookup).hexdigest
    if got != expected:
        raise DataHashMismatch(
            f"data {ref['uri']}: the assembled files hash to {got}, not to the manifest's "
            f"name {expected}; not used; {_unmark(store, key, expected)}"
        )
    _publish(tmp, target)
    log.info("assembled %d file(s) of %s at %s, verified", len(manifest.files), ref["uri"], target)
    return os.path.join(target, manifest.files[0].rel) if lone and manifest.files else target


def expected_hash(key: str) -> str | None:
    """The content hash a data-cache key names (``default/data-cache/{hash}``), else
    None (a ``gs://`` Data of the user's own: its objects' checksums are all there is)."""
    head, _, digest = key.rstrip("/").rpartition("/")
    if head.endswith(CACHE_PREFIX) and len(digest) == 64:
        with contextlib.suppress(ValueError):
            int(digest, 16)
            return digest
    return None


def _check_hash(
    ref: dict[str, Any], store: ObjectStore, key: str, path: str, digests: FileDigests | None
) -> None:
    expected = expected_hash(key)
    if expected is None:
        return
    known = digests.lookup if digests is not None else None
    got = content_hash(path, ref["uri"], None, known).hexdigest
    if got != expected:
        changed = _changed_after_marker(store, key)
        which = f"changed after the entry was complete: {', '.join(changed)}" if changed else ""
        raise DataHashMismatch(
            f"data {ref['uri']}: the downloaded files hash to {got}, not to the entry's "
            f"name {expected}; {which or 'an object of the entry was changed after upload'}"
            f"; not used; {_unmark(store, key, expected)}"
        )


def _marker_of(key: str) -> str:
    """What says the entry at ``key`` is complete: its marker, or the manifest itself."""
    if tree_hash(key) is not None:
        return key
    head, _, digest = key.rstrip("/").rpartition(CACHE_PREFIX)
    return head + MARKER_PREFIX + digest


def _unmark(store: ObjectStore, key: str, digest: str) -> str:
    """A bad entry loses its marker (the upload writes it last, and only for bytes
    that hash to the name): the next submit of that data uploads the entry again
    instead of every run hitting it.  Only the marker goes: the objects stay for a
    reader that has them already, and the next upload replaces them.  Says what
    happened, for the error."""
    marker = _marker_of(key)
    try:
        store.delete(marker)
    except Exception as exc:  # noqa: BLE001 - the mismatch is the error; say how to recover
        log.warning(
            "data cache entry %s is bad (its files do not hash to its name) and its "
            "marker %s could not be removed (%s): remove it so the next submit uploads "
            "the entry again",
            digest,
            store.uri(marker),
            exc,
        )
        return f"remove {store.uri(marker)} so the next submit uploads it again"
    log.warning(
        "data cache entry %s is bad (its files do not hash to its name): its marker "
        "was removed, so the next submit of that data uploads it again",
        digest,
    )
    return "the entry's marker was removed: the next submit of that data uploads it again"


def _changed_after_marker(store: ObjectStore, key: str) -> list[str]:
    """The entry's files written after its marker (the upload writes the marker last):
    the objects that were replaced, named for the error (only read on a mismatch)."""
    marker = _marker_of(key)
    try:
        sealed = stat_objects(store, marker).get(marker)
        if sealed is None:
            return []
        base = key.rstrip("/") + "/"
        objects = stat_objects(store, base)
    except Exception:  # noqa: BLE001 - only for the message: the mismatch is the error
        return []
    return sorted(k[len(base) :] for k, (_, t) in objects.items() if t > sealed[1])


def _sweep(parent: str, stem: str) -> None:
    """Remove partial dirs of ``stem`` left by processes that are gone (killed
    mid-download): never read, only deleted."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent):
            if not entry.startswith(stem):
                continue
            pid = entry[len(stem) :].split("-", 1)[0]
            if pid.isdigit() and not writer_alive(int(pid)):
                log.info("removing %s, a download cut short", os.path.join(parent, entry))
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _partial_dir(target: str) -> str:
    """A fresh temp dir name beside ``target`` (inside it when its parent is not
    writable, e.g. a mount path at ``/``); stale ones of dead owners are removed."""
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    if not os.access(parent, os.W_OK):
        os.makedirs(target, exist_ok=True)
        parent, name = target, ""
    stem = f".{name}{PARTIAL}"
    _sweep(parent, stem)
    return os.path.join(parent, f"{stem}{os.getpid()}-{secrets.token_hex(6)}")


def _publish(tmp: str, target: str) -> None:
    """``tmp`` becomes ``target``: one rename when the target is absent or an empty
    directory; entry by entry into an existing one (a mount point cannot be replaced)."""
    with contextlib.suppress(OSError):
        os.rename(tmp, target)
        return
    os.makedirs(target, exist_ok=True)
    for entry in os.listdir(tmp):
        dest = os.path.join(target, entry)
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        os.replace(os.path.join(tmp, entry), dest)
