"""``GcsStore``: the ``gs://`` object store on google-cloud-storage.

Only ``google-cloud-storage`` and the stdlib are used, because the pod runner imports
this module in a container that has nothing else (no Airflow).  Many-file transfers go
through ``transfer_manager`` with thread workers: the shared client's HTTP session is
reused, small files (the common case for code and data trees) are faster than with
processes, and the work is chunked so progress can be reported as it happens.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage import transfer_manager
from google.cloud.storage.retry import DEFAULT_RETRY

from airflow_provider_kinetic.core.storage._keys import (
    chunk_size,
    chunks,
    dir_prefix,
    join_key,
    materialise,
    safe_relpath,
)
from airflow_provider_kinetic.core.storage.base import (
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    ProgressFn,
)

#: Project used with the emulator, which ignores it but the client wants one.
EMULATOR_PROJECT = "test"
_DEFAULT_CONTENT_TYPE = "application/octet-stream"


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


def _widen_pool(client: storage.Client, workers: int) -> None:
    """Let ``workers`` threads share the client's HTTP session without churn.

    requests keeps 10 connections per host by default; more threads than that make
    urllib3 discard connections ("Connection pool is full") and reconnect per call.
    """
    if workers <= 10:
        return
    try:
        from requests.adapters import HTTPAdapter  # a google-cloud-storage dependency

        session = client._http
        for scheme in ("https://", "http://"):
            # Replace only the stock adapter: an mTLS adapter must stay in place.
            if type(session.adapters.get(scheme)) is HTTPAdapter:
                session.mount(scheme, HTTPAdapter(pool_maxsize=workers))
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
        workers: int = 8,
    ) -> None:
        self.bucket = bucket
        self.project = project
        self.workers = max(1, workers)
        self._client = client
        self._lock = threading.Lock()
        self._ready = False

    def __repr__(self) -> str:
        return f"GcsStore({self.bucket!r})"

    def __getstate__(self) -> dict[str, object]:
        """Pickle the address only: clients, sessions and locks do not travel."""
        return {"bucket": self.bucket, "project": self.project, "workers": self.workers}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @property
    def client(self) -> storage.Client:
        """The client, built on first use so constructing a store never authenticates."""
        if not self._ready:
            with self._lock:
                if self._client is None:
                    self._client = make_client(self.project)
                if not self._ready:
                    _widen_pool(self._client, self.workers)
                    self._ready = True
        assert self._client is not None
        return self._client

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
        self._blob(key).upload_from_filename(local_path, retry=DEFAULT_RETRY)
        return size

    def download_file(self, key: str, local_path: str) -> None:
        """Download into a temp file beside ``local_path`` and rename it into place,
        so a failed download never leaves a truncated file under the final name."""
        parent = os.path.dirname(os.path.abspath(local_path))
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{secrets.token_hex(8)}.kinetic-tmp")
        try:
            self._blob(key).download_to_filename(tmp, retry=DEFAULT_RETRY)
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
    ) -> int:
        """Parallel upload in chunks; progress after each chunk; raises on failure.

        ``transfer_manager`` only raises once the whole chunk has finished, so the
        first failure stops the upload at the end of its chunk.
        """
        bucket = self._bucket()
        jobs = []
        for rel in materialise(relpaths):
            path = os.path.join(root, *rel.split("/"))
            jobs.append((path, bucket.blob(join_key(prefix, rel)), os.path.getsize(path)))
        total, done, done_bytes = len(jobs), 0, 0
        for chunk in chunks(jobs, chunk_size(self.workers, total)):
            transfer_manager.upload_many(
                [(path, blob) for path, blob, _ in chunk],
                upload_kwargs={"retry": DEFAULT_RETRY},
                worker_type=transfer_manager.THREAD,
                max_workers=self.workers,
                raise_exception=True,
            )
            done += len(chunk)
            done_bytes += sum(size for _, _, size in chunk)
            if progress:
                progress(done, total, done_bytes)
        if progress and not jobs:
            progress(0, 0, 0)
        return done_bytes

    def download_prefix(
        self, prefix: str, local_dir: str, progress: ProgressFn | None = None
    ) -> list[str]:
        """Download every object under ``prefix/`` (directory semantics).

        Names ending in ``/`` are folder placeholders (console-created) and skipped;
        a name that would escape ``local_dir`` raises ``ValueError`` before anything
        is downloaded.
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
        pairs = list(zip(blobs, targets, strict=True))
        total, done, done_bytes = len(pairs), 0, 0
        for chunk in chunks(pairs, chunk_size(self.workers, total)):
            transfer_manager.download_many(
                chunk,
                download_kwargs={"retry": DEFAULT_RETRY},
                worker_type=transfer_manager.THREAD,
                max_workers=self.workers,
                raise_exception=True,
            )
            done += len(chunk)
            done_bytes += sum(b.size or 0 for b, _ in chunk)
            if progress:
                progress(done, total, done_bytes)
        if progress and not pairs:
            progress(0, 0, 0)
        return rels

    def list(self, prefix: str) -> list[str]:
        """Object names starting with ``prefix``, sorted; folder placeholders skipped."""
        names = (
            b.name for b in self.client.list_blobs(self.bucket, prefix=prefix, retry=DEFAULT_RETRY)
        )
        return sorted(n for n in names if not n.endswith("/"))

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
        with ThreadPoolExecutor(max_workers=min(self.workers, len(names))) as pool:
            return sum(pool.map(delete, names))
