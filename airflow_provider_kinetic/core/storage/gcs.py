"""``GcsStore``: the ``gs://`` object store on google-cloud-storage.

Only ``google-cloud-storage`` and the stdlib are used, because the pod runner imports
this module in a container that has nothing else (no Airflow).

Many-file transfers run on a thread pool sized from the file count and sizes
(``_parallel.plan_workers``): against a real bucket small objects are latency-bound,
so up to 64 requests are kept in flight, and the client's HTTP connection pool is
widened to match (with fewer connections than threads, urllib3 discards and
re-opens connections and threads queue).  Files of ``CHUNKED_MIN_BYTES`` or more go
up as parallel parts composed into one object, and downloads are verified per object
and sliced for big objects (``gcs_transfer.py``: why composite, why threads).
"""

from __future__ import annotations

import contextlib
import hashlib
import mimetypes
import os
import secrets
import threading
from collections.abc import Iterable

from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from airflow_provider_kinetic.core.storage._keys import (
    dir_prefix,
    join_key,
    materialise,
    safe_relpath,
)
from airflow_provider_kinetic.core.storage._parallel import plan_workers, run_parallel
from airflow_provider_kinetic.core.storage.base import (
    FileDigests,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    ProgressFn,
)
from airflow_provider_kinetic.core.storage.gcs_transfer import (
    SLICE_MIN_BYTES,
    SLICE_WORKERS,
    download_verified,
    single_shot,
    upload_composite,
)

#: Project used with the emulator, which ignores it but the client wants one.
EMULATOR_PROJECT = "test"
_DEFAULT_CONTENT_TYPE = "application/octet-stream"
#: Files at least this big upload in parallel parts (composed into one object).
CHUNKED_MIN_BYTES = 64 << 20
#: ``upload_files(digests=)``: files below this are read once into memory, hashed and
#: sent from those bytes; bigger ones are not hashed on the way.
HASHED_MAX_BYTES = 64 << 20
CHUNK_BYTES = 32 << 20
CHUNK_WORKERS = 16
_STOCK_POOL = 10  # requests' default connections per host


def make_client(project: str | None = None) -> storage.Client:
    """A storage client for this environment.

    With ``STORAGE_EMULATOR_HOST`` set (tests, local rehearsal) the client talks to
    the emulator with anonymous credentials, so a bare runner process needs no
    Application Default Credentials; otherwise ADC and ``project`` are used.
    """
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return storage.Client(
            project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT,
            credentials=AnonymousCredentials(),
        )
    # An explicit project=None would mean "no project" to the client; omit it instead
    # so the project is inferred from the environment / ADC.
    return storage.Client(project=project) if project else storage.Client()


def _widen_pool(client: storage.Client, size: int) -> None:
    """Give the client's HTTP session at least ``size`` connections per host.

    requests keeps 10 by default; more threads than connections make urllib3 discard
    connections ("Connection pool is full") and reconnect per call.  Only grows, so
    stores sharing a client never shrink each other's pool, and a warm pool is kept
    when it is already big enough.
    """
    if size <= _STOCK_POOL:
        return
    try:
        from requests.adapters import HTTPAdapter  # a google-cloud-storage dependency

        session = client._http
        for scheme in ("https://", "http://"):
            adapter = session.adapters.get(scheme)
            # Replace only the stock adapter: an mTLS adapter must stay in place.
            if type(adapter) is HTTPAdapter and getattr(adapter, "_pool_maxsize", 0) < size:
                session.mount(scheme, HTTPAdapter(pool_maxsize=size))
    except (AttributeError, ImportError):  # a custom transport: leave it alone
        pass


class GcsStore(ObjectStore):
    """Objects in one GCS bucket; keys are object names."""

    scheme = "gs"

    def __init__(
        self,
        bucket: str,
        client: storage.Client | None = None,
        project: str | None = None,
        workers: int | None = None,
        chunked_min_bytes: int | None = CHUNKED_MIN_BYTES,
        sliced_min_bytes: int = SLICE_MIN_BYTES,
    ) -> None:
        """``workers``: threads per many-file transfer (``None``: chosen from the file
        count and sizes).  ``chunked_min_bytes``: files this big upload in parallel
        parts (``None``: never).  ``sliced_min_bytes``: objects this big download in
        parallel slices."""
        self.bucket = bucket
        self.project = project
        self.workers = max(1, workers) if workers else None
        self.chunked_min_bytes = chunked_min_bytes
        self.sliced_min_bytes = sliced_min_bytes
        self._client = client
        self._lock = threading.Lock()
        self._pool = 0

    def __repr__(self) -> str:
        return f"GcsStore({self.bucket!r})"

    def __getstate__(self) -> dict[str, object]:
        """Pickle the address only: clients, sessions and locks do not travel."""
        return {
            "bucket": self.bucket,
            "project": self.project,
            "workers": self.workers,
            "chunked_min_bytes": self.chunked_min_bytes,
            "sliced_min_bytes": self.sliced_min_bytes,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @property
    def client(self) -> storage.Client:
        """The client, built on first use so constructing a store never authenticates."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = make_client(self.project)
        return self._client

    def workers_for(self, count: int, total_bytes: int) -> int:
        """As the store's own many-file transfers choose (latency-bound small objects
        get many), the HTTP pool widened to match."""
        return self._workers_for(count, total_bytes)

    def _workers_for(self, count: int, total_bytes: int) -> int:
        """Threads for a transfer, with the HTTP pool widened to serve them all."""
        workers = plan_workers(count, total_bytes, self.workers)
        if workers > self._pool:
            with self._lock:
                if workers > self._pool:
                    _widen_pool(self.client, workers)
                    self._pool = workers
        return workers

    def _bucket(self) -> storage.Bucket:
        return self.client.bucket(self.bucket)

    def _blob(self, key: str) -> storage.Blob:
        return self._bucket().blob(key)

    def uri(self, key: str = "") -> str:
        return f"gs://{self.bucket}/{key}" if key else f"gs://{self.bucket}"

    # -- single objects ------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self._blob(key).exists(retry=DEFAULT_RETRY)

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._blob(key).download_as_bytes(retry=DEFAULT_RETRY)
        except gexc.NotFound as e:
            raise ObjectNotFound(self.uri(key)) from e

    def write_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str | None = None,
        if_absent: bool = False,
    ) -> None:
        """Single-request upload (resumable above 8 MiB); GCS objects are atomic.

        ``if_absent`` sends ``ifGenerationMatch=0``.  Retries are on for both forms:
        rewriting identical bytes is harmless, and for ``if_absent`` a retry after a
        lost success response surfaces as ``PreconditionFailed`` (the object exists,
        which is what the caller asked about).
        """
        try:
            self._blob(key).upload_from_string(
                data,
                content_type=content_type or _DEFAULT_CONTENT_TYPE,
                if_generation_match=0 if if_absent else None,
                retry=DEFAULT_RETRY,
            )
        except gexc.PreconditionFailed as e:
            raise PreconditionFailed(self.uri(key)) from e

    def upload_file(self, local_path: str, key: str) -> int:
        size = os.path.getsize(local_path)
        if self.chunked_min_bytes is not None and size >= self.chunked_min_bytes:
            return self._upload_chunked(local_path, key)
        self._blob(key).upload_from_filename(local_path, retry=DEFAULT_RETRY)
        return size

    def download_file(self, key: str, local_path: str, size: int | None = None) -> None:
        """Download into a temp file beside ``local_path`` and rename it into place,
        so a failed download never leaves a truncated file under the final name.  An
        object the caller says is small (``size``) is read in one piece, as the
        many-object download reads it (``gcs_transfer.single_shot``)."""
        parent = os.path.dirname(os.path.abspath(local_path))
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{secrets.token_hex(8)}.kinetic-tmp")
        try:
            self._blob(key).download_to_filename(tmp, retry=DEFAULT_RETRY, **single_shot(size))
            os.replace(tmp, local_path)
        except gexc.NotFound as e:
            raise ObjectNotFound(self.uri(key)) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # -- many objects --------------------------------------------------------------

    def upload_files(
        self,
        root: str,
        relpaths: Iterable[str],
        prefix: str,
        progress: ProgressFn | None = None,
        digests: FileDigests | None = None,
    ) -> int:
        """Parallel upload; progress after every file; raises the first failure.

        Small files share a pool sized for latency (see module doc); each file of
        ``chunked_min_bytes`` or more is then sent in parallel parts.  ``digests``: a
        file below ``HASHED_MAX_BYTES`` (and the chunked threshold) is read once into
        memory, hashed and sent from those bytes (a retry resends the same ones); a
        bigger one is not recorded.
        """
        bucket = self._bucket()
        jobs = []
        rel_of: dict[str, str] = {}
        for rel in materialise(relpaths):
            path = os.path.join(root, *rel.split("/"))
            jobs.append((path, bucket.blob(join_key(prefix, rel)), os.path.getsize(path)))
            rel_of[path] = rel
        threshold = self.chunked_min_bytes
        big = [j for j in jobs if threshold is not None and j[2] >= threshold]
        small = [j for j in jobs if threshold is None or j[2] < threshold]
        workers = self._workers_for(len(small), sum(j[2] for j in small))
        total = len(jobs)

        def report(done: int, _small: int, nbytes: int) -> None:
            if progress:  # out of the whole upload, big files included
                progress(done, total, nbytes)

        def send(path: str, blob: storage.Blob) -> None:
            if digests is None or os.path.getsize(path) >= HASHED_MAX_BYTES:
                self._upload_one(path, blob)
                return
            with open(path, "rb") as f:
                data, st = f.read(), os.fstat(f.fileno())
            pre = digests.prefix(rel_of[path])
            if pre is not None:
                digests.record(path, pre, hashlib.sha256(pre + data).digest(), st)
            mime = mimetypes.guess_type(path)[0] or _DEFAULT_CONTENT_TYPE
            blob.upload_from_string(data, content_type=mime, retry=DEFAULT_RETRY)

        sent = run_parallel(small, send, workers, report if small else None)
        for done, (path, blob, size) in enumerate(big, start=len(small) + 1):
            self._upload_chunked(path, blob.name)
            sent += size
            if progress:
                progress(done, total, sent)
        if progress and not jobs:
            progress(0, 0, 0)
        return sent

    @staticmethod
    def _upload_one(path: str, blob: storage.Blob) -> None:
        blob.upload_from_filename(path, retry=DEFAULT_RETRY)

    def _upload_chunked(self, path: str, key: str) -> int:
        """One big file in parallel parts, composed (``gcs_transfer.upload_composite``)."""
        self._workers_for(CHUNK_WORKERS, CHUNK_WORKERS * CHUNK_BYTES)
        # Enough parts for every worker, each at most CHUNK_BYTES (at most 32 parts).
        part = min(CHUNK_BYTES, -(-os.path.getsize(path) // CHUNK_WORKERS))
        return upload_composite(self._bucket(), path, key, part, CHUNK_WORKERS)

    def download_prefix(
        self,
        prefix: str,
        local_dir: str,
        progress: ProgressFn | None = None,
        digests: FileDigests | None = None,
    ) -> list[str]:
        """Download every object under ``prefix/`` (directory semantics), verified.

        Names ending in ``/`` are folder placeholders (console-created) and skipped;
        a name that would escape ``local_dir`` raises ``ValueError`` before anything
        is downloaded.  Each file must match its listed size and CRC32C
        (``CorruptObject`` names one that does not); objects of ``sliced_min_bytes``
        or more download in parallel slices.  Files are written in place: a caller
        that must never see a partial tree downloads into a temp dir (as
        ``data.schemes.base.download_from_store`` does).  ``digests``: each file
        downloaded whole is hashed as its bytes arrive (sliced ones are not: their
        slices arrive out of order).
        """
        base = dir_prefix(prefix)
        blobs = [
            b
            for b in self.client.list_blobs(self.bucket, prefix=base, retry=DEFAULT_RETRY)
            if not b.name.endswith("/")
        ]
        blobs.sort(key=lambda b: b.name)
        rels = [b.name[len(base) :] for b in blobs]
        targets = [os.path.join(local_dir, *safe_relpath(r).split("/")) for r in rels]
        for parent in {os.path.dirname(t) for t in targets}:
            os.makedirs(parent, exist_ok=True)
        small = [b for b in blobs if (b.size or 0) < self.sliced_min_bytes]
        workers = self._workers_for(len(small), sum(b.size or 0 for b in small))
        self._workers_for(SLICE_WORKERS, 0)  # the pool serves a sliced object's streams
        pairs = list(zip(blobs, targets, strict=True))
        hashed = (rels, digests) if digests is not None else None
        nbytes = download_verified(pairs, workers, self.sliced_min_bytes, hashed)
        if progress:
            progress(len(pairs), len(pairs), nbytes)
        return rels

    def list(self, prefix: str) -> list[str]:
        """Object names starting with ``prefix``, sorted; folder placeholders skipped."""
        names = (
            b.name for b in self.client.list_blobs(self.bucket, prefix=prefix, retry=DEFAULT_RETRY)
        )
        return sorted(n for n in names if not n.endswith("/"))

    def delete(self, key: str) -> bool:
        try:
            self._bucket().delete_blob(key, retry=DEFAULT_RETRY)
        except gexc.NotFound:
            return False
        return True

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix/`` (directory semantics, never ``""``).

        Deletes run on a thread pool rather than as a JSON batch: batches are capped
        at 100 calls, and fake-gcs-server answers them with a non-multipart body the
        client cannot parse.  Objects already gone are not counted.  An empty prefix
        is refused, since it would empty the bucket.
        """
        base = dir_prefix(prefix)
        if not base:
            raise ValueError("delete_prefix needs a non-empty prefix")
        bucket = self._bucket()
        names = [
            b.name for b in self.client.list_blobs(self.bucket, prefix=base, retry=DEFAULT_RETRY)
        ]

        def delete(name: str) -> int:
            try:
                # By name, not the listed generation: an object rewritten since the
                # listing is deleted too (a listed blob's delete() pins its generation).
                bucket.delete_blob(name, retry=DEFAULT_RETRY)
            except gexc.NotFound:
                return 0  # already gone (a concurrent delete, or a retried success)
            return 1

        if not names:
            return 0
        gone: list[int] = []  # list.append is atomic; a shared counter's += is not

        def count(name: str, _unused: None) -> None:
            gone.append(delete(name))

        run_parallel([(n, None, 0) for n in names], count, self._workers_for(len(names), 0))
        return sum(gone)
