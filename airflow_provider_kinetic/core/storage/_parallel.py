"""Many-object transfers on a thread pool, shared by the GCS and local stores (stdlib).

Small objects against a real bucket are latency-bound, not CPU-bound: what matters is
how many requests are in flight, so the number of workers is chosen from the file
count and sizes (:func:`plan_workers`) rather than fixed.  Progress is reported from
the calling thread as each file finishes, and the first failure cancels what has not
started and is re-raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TypeVar

from airflow_provider_kinetic.core.storage.base import ProgressFn

A = TypeVar("A")
B = TypeVar("B")

#: Requests in flight for small objects: enough to hide ~50-100 ms of round trip per
#: request; measured on 2 cores, more workers cost nothing without latency either.
SMALL_OBJECT_WORKERS = 64
#: Objects up to this size count as small (a request's time is mostly round trip).
SMALL_OBJECT_BYTES = 1 << 20
#: For bigger objects, about this many bytes in flight in total (bandwidth-bound).
BYTES_IN_FLIGHT = 512 << 20
MIN_WORKERS = 8


def plan_workers(count: int, total_bytes: int, fixed: int | None = None) -> int:
    """Threads for ``count`` objects of ``total_bytes``: ``fixed`` when given, else
    many for small objects (latency-bound) and fewer for big ones (bandwidth-bound)."""
    if count <= 0:
        return 1
    if fixed:
        return max(1, min(fixed, count))
    average = total_bytes / count
    if average <= SMALL_OBJECT_BYTES:
        wanted = SMALL_OBJECT_WORKERS
    else:
        wanted = max(MIN_WORKERS, min(SMALL_OBJECT_WORKERS // 2, int(BYTES_IN_FLIGHT // average)))
    return max(1, min(count, wanted))


def run_parallel(
    jobs: Sequence[tuple[A, B, int]],
    transfer: Callable[[A, B], object],
    workers: int,
    progress: ProgressFn | None = None,
) -> int:
    """``transfer(a, b)`` for each ``(a, b, size)``; returns the bytes moved.

    ``progress`` gets ``(done, total, bytes_done)`` after every file and ``(0, 0, 0)``
    for no files.
    """
    total = len(jobs)
    if not jobs:
        if progress:
            progress(0, 0, 0)
        return 0
    done = done_bytes = 0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, total))) as pool:
        futures: dict[Future[object], int] = {
            pool.submit(transfer, a, b): size for a, b, size in jobs
        }
        try:
            for fut in as_completed(futures):
                fut.result()  # raises the first failure
                done += 1
                done_bytes += futures[fut]
                if progress:
                    progress(done, total, done_bytes)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return done_bytes
