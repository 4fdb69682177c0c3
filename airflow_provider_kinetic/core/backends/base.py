"""The backend contract: create a job from a JobSpec, read its status and logs, cancel it.

Status and log reads take only the :class:`JobHandle`, so any process (worker,
triggerer, a retry on another machine) can ask about a job it did not start.

Class-level hooks (no instance, no credentials) are what the rest of the package
asks a backend *kind* about: can it run this accelerator (``preflight``), where do
its jobs' artifacts live (``bucket_for``/``store_for``), what would it create
(``manifest``), where does a person look at a job (``console_url``).  Kinds are
looked up in :mod:`~airflow_provider_kinetic.core.backends.registry`, never compared
as strings.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.core.storage.fileuri import file_uri

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.storage import ObjectStore

#: A target's settings, as backends read them: a ``core.config.KineticConfig``.  Not
#: imported here, not even for the type checker: a config checks itself by asking the
#: backend registry, which sits above the backends.
TargetConfig = Any


class Backend(abc.ABC):
    """Where jobs run: a local process, a GKE Job, or a LeaderWorkerSet."""

    #: The kind, as written in connections and handles (``backend``).
    name: ClassVar[str]
    #: Whether the ``auto`` kind may pick this backend (in registration order).
    auto_candidate: ClassVar[bool] = False
    #: Whether it runs a job of several TPU slices (``num_slices > 1``; ``auto`` then
    #: picks ``registry.MULTI_SLICE``).
    runs_slices: ClassVar[bool] = False
    #: Whether building an instance needs Kubernetes API credentials (the Airflow
    #: layer then passes ``api_client_factory`` to :meth:`from_config`).
    needs_cluster: ClassVar[bool] = False
    #: First delay between polls (doubling up to ``poll_interval``); ``None`` polls
    #: every ``poll_interval`` from the start (a cluster's request rate stays as it was).
    first_poll_s: ClassVar[float | None] = None

    # ---- what a kind can tell without an instance --------------------------------
    @classmethod
    def preflight(cls, accelerator: Accelerator, requested: str | None = None) -> None:
        """Raise ``ValueError`` naming why this backend cannot run ``accelerator``
        (``requested``: the accelerator string as the task wrote it)."""
        return None

    @classmethod
    def validate_config(cls, config: TargetConfig) -> None:
        """Raise ``ValueError`` naming the connection extra this backend is missing."""
        return None

    @classmethod
    @abc.abstractmethod
    def bucket_for(cls, config: TargetConfig) -> str:
        """The store root this backend's jobs use (bucket name or local directory)."""

    @classmethod
    @abc.abstractmethod
    def store_for(cls, config: TargetConfig) -> ObjectStore:
        """The object store holding payloads, results, data cache and outputs."""

    @classmethod
    @abc.abstractmethod
    def from_config(
        cls, config: TargetConfig, api_client_factory: Callable[[], Any] | None = None
    ) -> Backend:
        """An instance for ``config`` (``api_client_factory`` when ``needs_cluster``)."""

    @classmethod
    @abc.abstractmethod
    def manifest(cls, spec: JobSpec) -> dict[str, Any]:
        """What ``submit`` would create, as a dict (dry run; needs no credentials)."""

    @classmethod
    def object_name(cls, job_id: str) -> str:
        """Name of the object this backend creates for a job (kinetic's naming)."""
        return f"kinetic-{job_id}"

    @classmethod
    def console_url(cls, handle: JobHandle) -> str:
        """Where a person looks at the job."""
        return file_uri(f"{handle.bucket_name}/{handle.job_id}/")

    @classmethod
    def logs_url(cls, handle: JobHandle) -> str | None:
        """A web page with the job's logs, if the platform has one."""
        return None

    @classmethod
    def group_logs_url(
        cls, group_id: str, project: str, cluster: str, namespace: str
    ) -> str | None:
        """A web page with the logs of every child of a batch, if the platform has one."""
        return None

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> None:
        """Create the job; raises if it could not be created."""

    @abc.abstractmethod
    def status(self, handle: JobHandle) -> StatusReport:
        """Current status of the job named by ``handle``."""

    @abc.abstractmethod
    def read_logs(
        self, handle: JobHandle, offset: int = 0, max_bytes: int | None = None
    ) -> tuple[str, int]:
        """Log text after ``offset`` and the new offset (so no line is shown twice).

        ``offset`` is opaque (bytes locally, lines for pods).  With ``max_bytes``
        the text holds at most that many bytes of whole lines (:func:`lines_within`;
        one longer line is cut into pieces where the offset can point inside it,
        or returned whole where it cannot) and the offset moves past just that
        text: the rest comes with the next read, so a caller following a chatty
        job does bounded work per read.  Where the backend knows when each line
        was written (pod logs; a local job's ``log.times``), the text is a
        :class:`TimedText` carrying those times.
        """

    @abc.abstractmethod
    def cancel(self, handle: JobHandle) -> None:
        """Stop the job; a job that is already gone is not an error."""

    def read_host_log(self, handle: JobHandle, host: int, lines: int) -> str | None:
        """The last ``lines`` of host ``host``'s log of a multi-host job, when it is not
        the log :meth:`read_logs` shows (the leader's); None: no such log here."""
        return None

    #: Whether the job's log outlives :meth:`release` where the backend keeps it (a
    #: cluster's logging does; the local backend's log file does not, so the job's
    #: log is archived in the store's history first).
    keeps_logs: bool = True

    def release(self, handle: JobHandle) -> None:
        """Remove what the backend still holds for an ended job once its outcome is
        collected (the local backend's state dir and temp files); clusters delete
        their objects in :meth:`cancel`, so this is a no-op there."""
        return None

    def batch_status(self, group_id: str, handles: list[JobHandle]) -> dict[str, StatusReport]:
        """Status of many children of one batch, keyed by job id.

        Backends answer with one query per call (GKE: one list by the group label;
        local: one scan of the state dir), whatever the number of children.
        """
        return {h.job_id: self.status(h) for h in handles}

    async def abatch_status(
        self, group_id: str, handles: list[JobHandle]
    ) -> dict[str, StatusReport]:
        return await asyncio.to_thread(self.batch_status, group_id, handles)

    def exists(self, handle: JobHandle) -> bool:
        return self.status(handle).status is not JobStatus.NOT_FOUND

    # Async wrappers for triggers: implementations with native async clients override.
    async def astatus(self, handle: JobHandle) -> StatusReport:
        return await asyncio.to_thread(self.status, handle)

    async def aread_logs(
        self, handle: JobHandle, offset: int = 0, max_bytes: int | None = None
    ) -> tuple[str, int]:
        return await asyncio.to_thread(self.read_logs, handle, offset, max_bytes)

    async def acancel(self, handle: JobHandle) -> None:
        await asyncio.to_thread(self.cancel, handle)

    # Waiting between polls: backends that can see a job end may return early.
    def wait(self, handles: list[JobHandle], seconds: float) -> None:
        """Sleep up to ``seconds``; return early if one of ``handles`` may have ended."""
        time.sleep(seconds)

    async def await_change(self, handles: list[JobHandle], seconds: float) -> None:
        await asyncio.sleep(seconds)


class TimedText(str):
    """A log read's text that also says when each of its lines was written:
    ``times[i]`` (ns since the epoch, None where unknown) for the i-th line of
    ``text.split("\\n")``.  A plain ``str`` to every reader that does not ask."""

    times: tuple[int | None, ...]

    def __new__(cls, text: str, times: Sequence[int | None]) -> TimedText:
        made = super().__new__(cls, text)
        made.times = tuple(times)
        return made


def line_times(text: str) -> tuple[int | None, ...]:
    """The times of ``text``'s lines where a backend gave them (:class:`TimedText`),
    else none (an empty tuple: every line's time is unknown)."""
    return getattr(text, "times", ())


def lines_within(lines: Sequence[str], max_bytes: int | None) -> int:
    """How many of ``lines`` (without their newlines) one capped read shows: the
    leading ones whose UTF-8 size, a newline each, fits in ``max_bytes``, and at
    least one, so every read makes progress.  The one rule for every log cap (the
    backends' capped reads, a batch's children's logs per poll)."""
    if max_bytes is None or max_bytes <= 0:
        return len(lines)
    size = 0
    for count, line in enumerate(lines):
        size += len(line.encode()) + 1
        if size > max_bytes:
            return max(count, 1)
    return len(lines)
