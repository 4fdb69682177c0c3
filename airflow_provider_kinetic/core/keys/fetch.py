"""``get``: a key's version into a local path, verified, all or nothing.

The content is downloaded into a temporary directory *beside* ``dest`` (same file
system, so the final step is a rename), hashed there with the very hash ``Data``
uses (no stat cache; a file is not read again only where its digest was taken
from its bytes as they arrived, and it has not changed since: ``FileDigests``), and
compared with the version.  Only a
match is renamed into place, so a dest that looks complete is complete; a mismatch
(a corrupted or truncated blob) removes the temporary copy and raises naming the
key, the version and both hashes.

Dest rules, checked before anything is read: a directory key goes to ``dest`` as a
directory, which must not exist or be empty unless ``overwrite=True``; a file key
goes to ``dest`` as a file, or into ``dest/{name}`` when ``dest`` is a directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.data.refs import cache_key, marker_key
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError, KeyNotFound
from airflow_provider_kinetic.core.keys.peer.receiving import tree_digests
from airflow_provider_kinetic.core.keys.records import Version
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.base import FileDigests

DEST_FORM = "give a path that does not exist or an empty directory, or overwrite=True"


class KeyVerifyError(KineticError, OSError):
    """The downloaded content does not hash to the version: nothing was written."""


def check_dest(dest: str, overwrite: bool) -> None:
    """Refuse a dest that exists and is not empty (before anything is read)."""
    if not dest:
        raise KeyNameError(f"dest {dest!r} is empty: {DEST_FORM}")
    if overwrite or not os.path.lexists(dest):
        return
    if os.path.isdir(dest) and not os.path.islink(dest):
        if not os.listdir(dest):
            return
        raise KeyNameError(f"dest {dest!r} is a directory that is not empty: {DEST_FORM}")
    raise KeyNameError(f"dest {dest!r} exists: {DEST_FORM}")


def get(
    keys: KeyStore,
    ref: str,
    dest: str | os.PathLike[str],
    version: str | None = None,
    *,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``ref``'s version (current, or ``version``) to ``dest``; returns its row
    with ``dest`` (the path written)."""
    check_dest(os.fspath(dest), overwrite)
    _, v = keys.resolve(ref, version)
    key = ref.partition("@")[0]
    store = keys.store
    if not store.exists(marker_key(v.version)):
        raise KeyNotFound(
            f"key {key!r} version {v.version[:12]}: its content is no longer in "
            f"{store.uri()} (collected by data gc?); put it again"
        )
    digests = tree_digests()
    return place_version(
        key,
        v,
        dest,
        overwrite,
        lambda tmp: _from_store(store, v, tmp, digests),
        digests=digests,
    )


def _from_store(store: ObjectStore, v: Version, tmp: str, digests: FileDigests) -> None:
    store.download_prefix(cache_key(v.version), tmp, digests=digests)


def place_version(
    key: str,
    v: Version,
    dest: str | os.PathLike[str],
    overwrite: bool,
    receive: Callable[[str], None],
    placed: Callable[[str], None] | None = None,
    digests: FileDigests | None = None,
    source: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """``receive(tmp)`` fills a temporary directory beside ``dest`` (from the store,
    or from peers: ``joblocal.py``, ``broadcast.py``); the tree is verified against
    ``v`` (``digests``: what ``receive`` hashed on the way) and renamed into place;
    ``placed(path)`` is told where it went.  ``source()`` names where the bytes came
    from, for the error when they do not hash to the version (default: the store)."""
    path = os.path.abspath(os.fspath(dest))
    check_dest(os.fspath(dest), overwrite)
    if v.kind == "file" and os.path.isdir(path) and not os.path.islink(path):
        path = os.path.join(path, v.name)
        check_dest(path, overwrite)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{secrets.token_hex(6)}.kinetic-get")
    try:
        os.makedirs(tmp)
        receive(tmp)
        if v.kind == "dir":
            for rel in v.empty_dirs:
                os.makedirs(os.path.join(tmp, *rel.split("/")), exist_ok=True)
        _verify(key, v, tmp, digests, source() if source is not None else "the store")
        _place(os.path.join(tmp, v.name) if v.kind == "file" else tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if placed is not None:
        placed(path)
    row = v.row(key)
    row["dest"] = path
    return row


def _verify(
    key: str, v: Version, tmp: str, digests: FileDigests | None = None, source: str = "the store"
) -> None:
    """Hash what arrived exactly as ``put`` hashed its source."""
    target = os.path.join(tmp, v.name) if v.kind == "file" else tmp
    known = digests.lookup if digests is not None else None
    try:
        got = content_hash(target, f"key {key}", None, known).hexdigest
    except (OSError, ValueError) as exc:  # a file key whose one file never arrived
        got = f"unreadable ({exc})"
    if got != v.version:
        raise KeyVerifyError(
            f"key {key!r} version {v.version}: the content read from {source} hashes to "
            f"{got}, not to the version (a corrupted, partial or false copy); nothing was "
            "written"
        )


def _place(src: str, dest: str) -> None:
    """Rename ``src`` to ``dest``; an existing dest (overwrite, or an empty dir) is
    moved aside first and removed after, so dest is never half old, half new."""
    if not os.path.lexists(dest):
        os.rename(src, dest)
        return
    aside = f"{dest}.{secrets.token_hex(6)}.kinetic-old"
    os.rename(dest, aside)
    try:
        os.rename(src, dest)
    except OSError:
        os.rename(aside, dest)
        raise
    if os.path.isdir(aside) and not os.path.islink(aside):
        shutil.rmtree(aside, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)
