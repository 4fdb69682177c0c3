"""Incremental Data uploads: bytes sent and store growth follow the files that changed.

The ``files`` layout (the default; ``data_layout`` on the connection) stores each
distinct file content once, as ``default/data-files/{sha256 of its bytes}``, and each
tree (a kinetic content hash) as a manifest, ``default/data-trees/{hash}.json``
(``manifest.py``).  Uploading a tree sends only the file contents the store lacks, so
a tree with one changed file sends that file and the manifest, and a file unchanged
across versions, or shared by two trees, is stored once.

What is sent is what was hashed: each file is read once, its SHA-256 (its object's
name) and its kinetic digest (``relpath + NUL + bytes``) are taken from the same bytes
that are uploaded (a file up to ``INLINE_BYTES`` is uploaded from that buffer; a bigger
one is streamed and read again after its upload), and the kinetic digests must give
the Data's content hash, else ``DataChangedDuringUpload`` and no manifest.  An object
whose bytes would not be its name is never left behind.

Completeness: the manifest is written after every object it names; on a local store
the caller then links the tree's data-cache entry to those objects (hard links: no
byte is stored twice) and writes the marker last, so everything that reads an entry
dir (the local runner, volumes, FUSE, kinetic's own runner) reads it as before.

Concurrency: an upload claims the content hash first
(``default/data-trees/{hash}.claim``, written if absent); a second upload of the same
content waits for the first to complete (or for its claim to go) instead of sending
the same bytes again; a claim whose uploader is gone (same host, no such process) or
older than ``CLAIM_STALE_S`` (another host's killed uploader) is taken over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from airflow_provider_kinetic.core.data.manifest import Manifest, ManifestFile
from airflow_provider_kinetic.core.data.refs import (
    TREES_PREFIX,
    cache_key,
    file_key,
    tree_key,
)
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path
from airflow_provider_kinetic.core.storage.base import PreconditionFailed, StoreFullError
from airflow_provider_kinetic.core.storage.local_disk import writer_alive

log = logging.getLogger(__name__)

#: Files up to this size are read into memory once: hashed and uploaded from one buffer.
INLINE_BYTES = 8 << 20
#: Concurrent file reads, existence checks and uploads of one tree: a disk, or a
#: bucket whose round trips are hidden by more at once.
WORKERS = {"file": 8}
BUCKET_WORKERS = 32
#: A claim older than this is a killed uploader's: taken over.
CLAIM_STALE_S = 15 * 60.0
#: How often a waiting upload looks again.
WAIT_POLL_S = 0.2


class DataChangedDuringUpload(KineticError, RuntimeError):
    """The bytes an upload sent do not hash to the entry's name: a file of the Data
    changed between its hashing and its upload.  No marker is written."""


@dataclass(frozen=True)
class Sent:
    """What one incremental upload did."""

    files: int  # file objects sent
    bytes: int  # bytes of those objects
    reused: int  # files whose content the store had already
    manifest_bytes: int


def claim_key(content_hash: str) -> str:
    return f"{TREES_PREFIX}/{content_hash}.claim"


def claim(store: ObjectStore, digest: str, complete: Callable[[], bool]) -> bool:
    """Claim the upload of ``digest``; False when another upload completed it while
    this one waited (nothing to send).  Waits while another live upload holds it."""
    key = claim_key(digest)
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
    announced = False
    while True:
        try:
            store.write_bytes(key, body.encode(), if_absent=True)
        except PreconditionFailed:
            pass
        else:
            if not complete():
                return True
            release(store, digest)  # completed by the upload whose claim just went
            return False
        if complete():
            return False
        try:
            held = json.loads(store.read_bytes(key))
            age = time.time() - float(held.get("at", 0))
            dead = held.get("host") == socket.gethostname() and not writer_alive(int(held["pid"]))
        except Exception:  # noqa: BLE001 - gone meanwhile, or unreadable: look again
            age, dead = 0.0, False
        if age > CLAIM_STALE_S or dead:
            why = "its uploader is gone" if dead else f"it is {age:.0f} s old"
            log.warning("data upload claim %s: %s; taking it over", key, why)
            with contextlib.suppress(Exception):
                store.delete(key)
            continue
        if not announced:
            log.info("data %s is being uploaded by another task: waiting for it", digest[:12])
            announced = True
        time.sleep(WAIT_POLL_S)  # another upload of the same bytes is in flight


def release(store: ObjectStore, digest: str) -> None:
    with contextlib.suppress(Exception):
        store.delete(claim_key(digest))


def upload_tree(
    store: ObjectStore,
    digest: str,
    root: str,
    files: list[tuple[str, int]],
    is_dir: bool,
    label: str,
) -> tuple[Manifest, Sent]:
    """Send the file contents the store lacks and write the manifest of ``digest``."""
    sending: set[str] = set()
    lock = threading.Lock()
    sent = [0, 0]

    def one(rel: str) -> tuple[ManifestFile, bytes]:
        path = os.path.join(root, *rel.split("/"))
        prefix = rel.encode() + b"\0"
        raw, kin = hashlib.sha256(), hashlib.sha256(prefix)
        size = os.path.getsize(path)
        buf = None
        with open(path, "rb") as f:
            if size <= INLINE_BYTES:
                buf = f.read()
                raw.update(buf)
                kin.update(buf)
            else:
                while chunk := f.read(1 << 20):
                    raw.update(chunk)
                    kin.update(chunk)
        sha = raw.hexdigest()
        size = len(buf) if buf is not None else size
        with lock:
            mine = sha not in sending
            sending.add(sha)
        # One existence check per distinct content (not a listing of every object:
        # what this costs follows the tree, not the bucket).
        if mine and not store.exists(file_key(sha)):
            try:
                wrote = _send(store, path, sha, buf, label)
            except StoreFullError as exc:
                raise StoreFullError(
                    f"uploading {label} (data cache entry {digest}/{rel}): {exc}", exc.errno
                ) from exc
            with lock:
                sent[0] += 1
                sent[1] += size
                if wrote:  # not another upload's: that one may be using it
                    written.append(file_key(sha))
        return ManifestFile(rel, size, sha), kin.digest()

    rels = [rel for rel, _ in files]
    written: list[str] = []
    try:
        workers = WORKERS.get(store.scheme, BUCKET_WORKERS)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rels)))) as pool:
            done = list(pool.map(one, rels))
    except StoreFullError:
        _drop(store, written)  # a full disk keeps nothing no manifest names
        raise
    kind = b"dir:" if is_dir else b"file:"
    got = hashlib.sha256(kind + b"".join(d for _, d in done)).hexdigest()
    if got != digest:
        raise DataChangedDuringUpload(
            f"data {label} changed between its hashing and its upload: the bytes read "
            f"hash to {got}, not {digest}, so no manifest was written (no job reads it; "
            "the next run uploads it again). Let whatever writes the data finish first"
        )
    manifest = Manifest(digest, is_dir, tuple(m for m, _ in done))
    body = manifest.encode()
    store.write_bytes(tree_key(digest), body, content_type="application/json")
    reused = len(rels) - sent[0]
    return manifest, Sent(sent[0], sent[1], reused, len(body))


def _drop(store: ObjectStore, keys: list[str]) -> None:
    for key in keys:
        try:
            store.delete(key)
        except OSError as exc:
            log.warning("could not remove %s after a failed upload: %s", store.uri(key), exc)


def _send(store: ObjectStore, path: str, sha: str, buf: bytes | None, label: str) -> bool:
    """Upload one file content under its SHA-256; a streamed file is read again after
    its upload and its object removed if the bytes changed meanwhile.  False when
    another upload wrote the object first."""
    key = file_key(sha)
    try:
        if buf is not None:
            store.write_bytes(key, buf, if_absent=True)
        else:
            store.upload_file(path, key)
            again = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    again.update(chunk)
            if again.hexdigest() != sha:
                store.delete(key)
                raise DataChangedDuringUpload(
                    f"data {label}: {path} changed while it was uploaded; nothing of it "
                    "was kept. Let whatever writes the data finish first"
                )
    except PreconditionFailed:
        return False  # another upload sent the same bytes first
    if store.scheme == "file":
        with contextlib.suppress(OSError):
            os.chmod(file_uri_path(store.uri(key)), 0o444)
    return True


def make_read_only(path: str) -> None:
    """Files 0444 and directories 0555 below ``path`` (a complete local entry)."""
    for dirpath, _, files in os.walk(path, topdown=False):
        for name in files:
            full = os.path.join(dirpath, name)
            if os.lstat(full).st_mode & 0o777 != 0o444:  # a chmod moves a shared ctime
                os.chmod(full, 0o444)
        os.chmod(dirpath, 0o555)


def link_entry(store: ObjectStore, manifest: Manifest) -> int:
    """Local store: the tree's data-cache entry as hard links to its file objects (no
    byte stored twice); a copy where a link cannot be made (another file system, a
    link count limit).  Returns how many files were copied."""
    entry = file_uri_path(store.uri(cache_key(manifest.content_hash)))
    for dirpath, _, _ in os.walk(entry):  # an interrupted upload's, made read-only
        os.chmod(dirpath, 0o755)
    copied = 0
    for f in manifest.files:
        src = file_uri_path(store.uri(file_key(f.sha256)))
        dst = os.path.join(entry, *f.rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.stat(src), os.lstat(dst)):
                continue
            os.unlink(dst)  # an interrupted upload's: replaced
        try:
            os.link(src, dst)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP):
                raise
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o444)
            copied += 1
    if manifest.files:
        make_read_only(entry)
    if copied:
        log.warning(
            "data cache entry %s: %d file(s) copied, not linked (the store's file objects "
            "cannot be hard-linked there)",
            entry,
            copied,
        )
    return copied
