"""Big and many-object GCS transfers that are verified: what a pod waits on at start.

Downloads (:func:`download_verified`): many small objects at once through
``transfer_manager.download_many`` and each object of ``slice_min`` bytes or more in
slices through ``transfer_manager.download_chunks_concurrently``, both on threads.
Every file is checked against the listing it came from (the pinned generation's size
and CRC32C): the bytes are checksummed as they are written (no second read), and a
file that does not match raises :class:`CorruptObject` naming it.  Objects up to
``SINGLE_SHOT_MAX_BYTES`` are read in one piece (the client's ``single_shot_download``)
rather than streamed in its 8 KiB chunks: per 1 MiB object, 128 reads, writes, CRC and
SHA-256 updates, each giving up and retaking the GIL among dozens of threads, become
one.  On 2 CPUs that nearly halved the downloader's CPU for 2,000 x 1 MiB objects
(15-17 s to 8-10 s), and there that CPU, not the network, is what a pod waits on.
An object is always read at its listed generation: one replaced or deleted after the
listing answers 404, refused with the file named.

Uploads (:func:`upload_composite`): one big file as parallel part objects, composed
into the final object and then deleted; the final object's CRC32C must equal the
parts' combined CRC32C (each part's own was checked by the client against what the
server stored), and its name and bytes are exactly what a plain upload writes.

Why threads (``worker_type=THREAD``) and not processes: the bytes move in C (socket
reads, CRC32C, file writes release the GIL), so threads keep every stream busy; the
client and its credentials stay in this process (process workers pickle a client per
blob and re-authenticate), and a pod starting its function should not fork workers.
Why composite rather than ``upload_chunks_concurrently``: that uses the XML multipart
API, which fake-gcs-server lacks (400), so it could not be tested here; compose is in
both, and one tested path serves the emulator and Google Cloud Storage alike.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import inspect
import mimetypes
import os
import secrets
from collections.abc import Sequence
from typing import BinaryIO

import google_crc32c
from google.api_core import exceptions as gexc
from google.cloud import storage
from google.cloud.storage import transfer_manager
from google.cloud.storage.exceptions import DataCorruption
from google.cloud.storage.retry import DEFAULT_RETRY

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage._crc import crc32c_combine
from airflow_provider_kinetic.core.storage._keys import PARTS_PREFIX
from airflow_provider_kinetic.core.storage._parallel import run_parallel
from airflow_provider_kinetic.core.storage.base import FileDigests

#: Objects up to this size arrive in one read (one write, one checksum update each);
#: bigger ones are streamed.  Bounds the memory the small-object workers hold at once
#: (at most 64 of them: 256 MiB).
SINGLE_SHOT_MAX_BYTES = 4 << 20
#: ``single_shot_download`` came with google-cloud-storage 3.x; an older client
#: (the runtime allows >= 2.14) streams every object, as before.
_HAS_SINGLE_SHOT = (
    "single_shot_download" in inspect.signature(storage.Blob.download_to_file).parameters
)
#: Objects this big download in slices (several streams for one object).
SLICE_MIN_BYTES = 64 << 20
SLICE_BYTES = 32 << 20
SLICE_WORKERS = 16
#: GCS composes at most 32 source objects in one call (the parts live under
#: ``PARTS_PREFIX``, outside any data prefix, until composed).
MAX_COMPOSE = 32
#: Each part goes up in requests of this size (memory per worker).
PART_REQUEST_BYTES = 16 << 20


class CorruptObject(KineticError, ValueError):
    """A downloaded or uploaded object's bytes do not match its checksum: never used."""


def b64_crc(value: int) -> str:
    """GCS's spelling of a CRC32C: base64 of the 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


class _CheckedFile:
    """The destination of one download: opened on the first write, CRC32C'd (and,
    with a digest ``prefix``, SHA-256'd) as the bytes arrive, closed once the listed
    size is written (so thousands of pending downloads do not hold thousands of
    descriptors).  ``stat``: the file as its last byte left it (for ``FileDigests``)."""

    def __init__(self, path: str, size: int, prefix: bytes | None = None) -> None:
        self.path, self.size = path, size
        self.written = 0
        self.crc = 0
        self.prefix = prefix
        self.sha = hashlib.sha256(prefix) if prefix is not None else None
        self.stat: os.stat_result | None = None
        self._file: BinaryIO | None = None

    def write(self, chunk: bytes) -> int:
        if self._file is None:  # appending after the listed size: the check fails it
            mode = "ab" if self.written else "wb"
            self._file = open(self.path, mode)  # noqa: SIM115 - closed at the listed size
        self._file.write(chunk)
        self.crc = google_crc32c.extend(self.crc, chunk)
        if self.sha is not None:  # releases the GIL on big chunks, as the CRC does
            self.sha.update(chunk)
        self.written += len(chunk)
        if self.written == self.size:  # size -1: unknown (closed at the end)
            self.close()
        return len(chunk)

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self.stat = os.fstat(self._file.fileno())
            self._file.close()
            self._file = None
        elif self.written == 0 and not os.path.exists(self.path):
            open(self.path, "wb").close()  # an empty object: never written to
            self.stat = os.stat(self.path)


def _for_download(blob: storage.Blob) -> storage.Blob:
    """The listed blob, downloaded by name and pinned generation from the client's own
    endpoint (a listed media link names the server's idea of its host, which a proxy
    or a private endpoint in between would be bypassed by)."""
    blob._properties.pop("mediaLink", None)
    return blob


def _where(blob: storage.Blob, path: str) -> str:
    return f"{path} (gs://{blob.bucket.name}/{blob.name}, generation {blob.generation})"


def download_verified(
    pairs: Sequence[tuple[storage.Blob, str]],
    workers: int,
    slice_min: int = SLICE_MIN_BYTES,
    hashed: tuple[Sequence[str], FileDigests] | None = None,
    single_shot_max: int = SINGLE_SHOT_MAX_BYTES,
) -> int:
    """Download each listed ``(blob, path)``; returns the bytes written.

    Objects of ``slice_min`` bytes or more go in slices (:func:`slice_size`), those of
    ``single_shot_max`` bytes or less in one read each, the others streamed.  Parents
    of every path must exist.  Raises :class:`CorruptObject` naming the first
    file whose size or CRC32C is not the listing's, and re-raises the first failure.
    ``hashed``: each pair's relative name and where the digests of the files
    downloaded whole go (recorded only once a file passed its check).
    """
    # What the listing says, kept apart: a download updates a blob's properties from
    # the response's headers, and the check is against the listing.
    listed = {id(b): (b.size or 0, b.crc32c) for b, _ in pairs}
    # A gzip-encoded object arrives decompressed (as kinetic's runner gets it), so its
    # stored size and CRC32C say nothing about the bytes written: not sliced, not held
    # to them.
    whole = [_gzipped(b) or (b.size or 0) < slice_min for b, _ in pairs]
    small = [pair for pair, w in zip(pairs, whole, strict=True) if w]
    big = [pair for pair, w in zip(pairs, whole, strict=True) if not w]
    prefixes: list[bytes | None] = [None] * len(pairs)
    if hashed is not None:
        prefixes = [hashed[1].prefix(rel) for rel in hashed[0]]
    small_prefixes = [pre for pre, w in zip(prefixes, whole, strict=True) if w]
    files = [
        _CheckedFile(p, -1 if _gzipped(b) else b.size or 0, pre)
        for (b, p), pre in zip(small, small_prefixes, strict=True)
    ]
    # By the listing too: a gzip-encoded object's decompressed size is not known.
    shot = [
        _HAS_SINGLE_SHOT and not _gzipped(b) and (b.size or 0) <= single_shot_max for b, _ in small
    ]
    try:
        for one_read in (True, False):
            chosen = [
                (p, f) for p, f, one in zip(small, files, shot, strict=True) if one == one_read
            ]
            if not chosen:
                continue
            kwargs: dict[str, object] = {"checksum": None, "retry": DEFAULT_RETRY}
            if one_read:
                kwargs["single_shot_download"] = True
            # Every result kept (raise_exception waits for all of them too) so that a
            # failure names its file.
            results = transfer_manager.download_many(
                [(_for_download(b), f) for (b, _), f in chosen],
                download_kwargs=kwargs,
                raise_exception=False,
                worker_type=transfer_manager.THREAD,
                max_workers=max(1, min(workers, len(chosen))),
            )
            for ((blob, path), _), result in zip(chosen, results, strict=True):
                _raise_failure(blob, path, result)
    finally:
        for f in files:
            f.close()
    for (blob, path), f in zip(small, files, strict=True):
        if not _gzipped(blob):
            _check(blob, path, (f.written, b64_crc(f.crc)), listed[id(blob)])
        if hashed is not None and f.sha is not None and f.prefix is not None and f.stat:
            hashed[1].record(path, f.prefix, f.sha.digest(), f.stat)
    for blob, path in big:
        _download_sliced(blob, path, slice_size(blob.size or 0))
        # The client compared the slices' combined CRC32C with the object's as the
        # responses gave it; that must be the listing's too (same generation).
        _check(blob, path, (os.path.getsize(path), blob.crc32c), listed[id(blob)])
    return sum(size for size, _ in listed.values())


def single_shot(size: int | None) -> dict[str, bool]:
    """The download kwargs for an object of ``size`` bytes (None: unknown): read in
    one piece when it is small and the client can."""
    small = size is not None and size <= SINGLE_SHOT_MAX_BYTES
    return {"single_shot_download": True} if small and _HAS_SINGLE_SHOT else {}


def _raise_failure(blob: storage.Blob, path: str, result: object) -> None:
    """Re-raise a download's failure; a 404 for the listed generation means the object
    was replaced or deleted after the listing, said so with the file named."""
    if isinstance(result, gexc.NotFound):
        raise CorruptObject(
            f"data file {_where(blob, path)} was replaced or deleted after it was listed; not used"
        ) from result
    if isinstance(result, BaseException):
        raise result


def _gzipped(blob: storage.Blob) -> bool:
    return (blob.content_encoding or "").lower() == "gzip"


def slice_size(size: int) -> int:
    """Bytes per slice: enough slices to keep every worker busy, each at most
    ``SLICE_BYTES`` (a request's worth: a retry repeats one slice, not the object)."""
    return max(1, min(SLICE_BYTES, -(-size // SLICE_WORKERS)))


def _check(
    blob: storage.Blob, path: str, got: tuple[int, str | None], want: tuple[int, str | None]
) -> None:
    if got[0] != want[0] or (want[1] and got[1] != want[1]):
        raise CorruptObject(
            f"data file {_where(blob, path)} does not match its object: got {got[0]} bytes "
            f"with CRC32C {got[1]}, the store lists {want[0]} bytes with CRC32C {want[1]}; "
            "not used"
        )


def _download_sliced(blob: storage.Blob, path: str, slice_bytes: int) -> None:
    """One big object as ranged reads on threads, written in place; the client combines
    the slices' CRC32Cs and compares them with the listed one."""
    try:
        transfer_manager.download_chunks_concurrently(
            _for_download(blob),
            path,
            chunk_size=slice_bytes,
            download_kwargs={"retry": DEFAULT_RETRY},
            worker_type=transfer_manager.THREAD,
            max_workers=SLICE_WORKERS,
            crc32c_checksum=True,
        )
    except gexc.NotFound as exc:
        _raise_failure(blob, path, exc)
    except DataCorruption as exc:
        raise CorruptObject(
            f"data file {_where(blob, path)} does not match its object's CRC32C "
            f"{blob.crc32c}; not used"
        ) from exc


class _Range:
    """A read-only window ``[start, start + length)`` of a file, as a stream the client
    reads a part from (it seeks and tells within the window on a retry)."""

    def __init__(self, path: str, start: int, length: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed by the part's upload
        self._start, self._length = start, length
        self._f.seek(start)

    def read(self, n: int = -1) -> bytes:
        left = self._start + self._length - self._f.tell()
        return self._f.read(left if n is None or n < 0 else min(n, left))

    def tell(self) -> int:
        return self._f.tell() - self._start

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.tell(), 2: self._length}[whence]
        self._f.seek(self._start + min(max(0, base + offset), self._length))
        return self.tell()

    def close(self) -> None:
        self._f.close()


def part_size(size: int, minimum: int) -> int:
    """Bytes per part: at least ``minimum``, and few enough parts for one compose."""
    per = max(minimum, -(-size // MAX_COMPOSE))
    return -(-per // (1 << 20)) * (1 << 20)  # whole MiB


def upload_composite(
    bucket: storage.Bucket, path: str, key: str, part_bytes: int, workers: int
) -> int:
    """Upload ``path`` to ``key`` as parallel parts composed into one object.

    The parts (under :data:`PARTS_PREFIX`) are deleted whatever happens; the final
    object appears whole or not at all (compose is atomic).  Returns the size.
    """
    size = os.path.getsize(path)
    per = part_size(size, part_bytes)
    spans = [(start, min(per, size - start)) for start in range(0, size, per)]
    token = secrets.token_hex(8)
    parts = [bucket.blob(f"{PARTS_PREFIX}/{token}/{i:02d}") for i in range(len(spans))]
    for part in parts:
        part.chunk_size = PART_REQUEST_BYTES
    try:
        run_parallel(
            [(part, span, span[1]) for part, span in zip(parts, spans, strict=True)],
            lambda part, span: _upload_part(part, path, *span),
            workers,
        )
        final = bucket.blob(key)
        final.content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        final.compose(parts, retry=DEFAULT_RETRY)
        crc = crc32c_combine([(_crc_int(p.crc32c), p.size or 0) for p in parts])
        if final.size != size or final.crc32c != b64_crc(crc):
            with contextlib.suppress(Exception):
                final.delete(retry=DEFAULT_RETRY)
            raise CorruptObject(
                f"composed gs://{bucket.name}/{key} is {final.size} bytes with CRC32C "
                f"{final.crc32c}; {path} is {size} bytes with CRC32C {b64_crc(crc)}: deleted"
            )
    finally:
        _delete_parts(parts)
    return size


def _upload_part(part: storage.Blob, path: str, start: int, length: int) -> None:
    """One part; the client checksums what it sends and refuses a stored part whose
    CRC32C differs (so the part's listed CRC32C is the file's bytes)."""
    stream = _Range(path, start, length)
    try:
        part.upload_from_file(stream, size=length, checksum="crc32c", retry=DEFAULT_RETRY)
    finally:
        stream.close()


def _crc_int(b64: str | None) -> int:
    if not b64:
        raise CorruptObject("a composite upload's part has no CRC32C")
    return int.from_bytes(base64.b64decode(b64), "big")


def _delete_parts(parts: list[storage.Blob]) -> None:
    """Best effort: a part left behind is outside every data prefix (a bucket
    lifecycle rule on ``.kinetic-parts/`` can sweep what a killed client leaves)."""

    def delete(part: storage.Blob, _unused: None) -> None:
        with contextlib.suppress(Exception):
            part.bucket.delete_blob(part.name, retry=DEFAULT_RETRY)

    run_parallel([(p, None, 0) for p in parts], delete, len(parts) or 1)
