"""The machine-wide job slots and their FIFO queue, as files (the supervisor's side).

``[kinetic] local_max_jobs`` bounds the local jobs that run at once on a machine,
whichever Airflow worker, triggerer or DAG run submitted them, so the bound lives in
the filesystem, in one directory per machine (``local_slots.slots_dir``):

- ``slot-{i}.lock`` for ``i < limit``: a running job holds one ``flock``; its
  supervisor passes the fd to the job, so the slot is taken while either process
  lives and the kernel frees it however both end (SIGKILL included).
- ``queue/{ticket}``: one file per job waiting (or about to wait) for a slot, named
  so that names sort in submit order (``time_ns``, then the submitter's pid and a
  counter).  The submitter creates it already ``flock``ed and hands the fd to the
  supervisor, so a ticket is *live* exactly while its submitter or supervisor lives:
  a dead one (a SIGKILLed supervisor) is found by a non-blocking ``flock`` that
  succeeds, with no pid that could have been reused, and removed by whoever finds it.
- ``alloc.lock``: held for one scan (list, check the front, try the slots), never
  while waiting, so two supervisors never both take the last slot out of turn.

A job may take a slot when fewer live tickets are ahead of it than there are free
slots (FIFO: a later job never takes the slot an earlier one is due).  Waiting is
polled with a backoff (20 ms at the front of the queue, longer behind it); a job's
status counts the tickets ahead of it from one listing of ``queue/``.

This module is imported by the supervisor, which starts once per job and imports
nothing of the package: standard library only.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import itertools
import os
import time
from collections.abc import Callable, Iterator

#: The job dir's request for a slot: {"dir", "limit", "ticket", "fd"} (from the backend).
SLOTS_FILE = "slots.json"
#: The slot a job got, written by its supervisor before it leaves the queue.
SLOT_FILE = "slot"
#: Written by the supervisor when it first has to wait: the job reads as queued.
WAIT_FILE = "slot-wait"
QUEUE_DIR = "queue"
ALLOC_LOCK = "alloc.lock"
#: Longest pause between tries at the front of the queue (a freed slot is taken within
#: this), within ``limit`` of the front, and further behind (first pause: the first).
RETRY_S = (0.02, 0.1, 0.5)

_counter = itertools.count()


def ticket_name() -> str:
    """A new ticket's name: sorts by creation time, unique across processes."""
    return f"{time.time_ns():020d}-{os.getpid()}-{next(_counter)}"


def make_dir(path: str) -> None:
    """The machine-wide dir and its queue, made like /tmp (every user's jobs use them)."""
    make_shared_dir(path)
    make_shared_dir(os.path.join(path, QUEUE_DIR))


def make_shared_dir(path: str) -> None:
    """``path`` made like /tmp (sticky, world-writable) when missing: every user's jobs
    add lock files and tickets there (the GPU locks' dir too)."""
    if os.path.isdir(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    os.chmod(path, 0o1777)


def queued_message(ahead: int, limit: int) -> str:
    """What a job waiting for a slot says, in its status and its own log."""
    jobs = "job" if ahead == 1 else "jobs"
    return f"queued: {ahead} {jobs} ahead (local_max_jobs={limit})"


def open_ticket(slots_dir: str, name: str, content: str) -> int:
    """Create the ticket ``name``, locked, and return the fd that holds the lock.

    Made under a dot name and renamed into place once locked: a scan never sees a
    ticket whose lock is not held yet (it would take it for a dead one)."""
    queue = os.path.join(slots_dir, QUEUE_DIR)
    tmp = os.path.join(queue, f".{name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, content.encode())
        os.rename(tmp, os.path.join(queue, name))
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    return fd


def waiting(slots_dir: str) -> list[str]:
    """The tickets in the queue, in submit order (one listing)."""
    try:
        names = os.listdir(os.path.join(slots_dir, QUEUE_DIR))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if not n.startswith("."))


def ahead_of(names: list[str], ticket: str) -> int:
    """How many of the sorted ``names`` come before ``ticket``."""
    return bisect.bisect_left(names, ticket)


def is_live(path: str) -> bool:
    """Whether a ticket's lock is held (its submitter or supervisor lives).  One we
    cannot open (another user's, 0600) counts as live: it is theirs to remove."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove(slots_dir: str, ticket: str) -> None:
    """Take ``ticket`` out of the queue (gone already, or not ours: nothing to do)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        os.remove(os.path.join(slots_dir, QUEUE_DIR, ticket))


def _live_ahead(slots_dir: str, front: list[str], limit: int) -> int:
    """How many of ``front`` (the tickets ahead) count: dead ones are removed, from
    the front, until ``limit`` live ones are seen (only those decide a slot)."""
    queue, live, dead = os.path.join(slots_dir, QUEUE_DIR), 0, 0
    for name in front:
        if live >= limit:
            break
        if is_live(os.path.join(queue, name)):
            live += 1
        else:
            remove(slots_dir, name)
            dead += 1
    return len(front) - dead


def _free_slots(slots_dir: str, limit: int, wanted: int) -> list[tuple[int, int]]:
    """Lock up to ``wanted`` free slots of the ``limit``; (index, fd) pairs."""
    paths = {index: os.path.join(slots_dir, f"slot-{index}.lock") for index in range(limit)}
    return lock_free(paths, wanted)


def lock_free(paths: dict[int, str], wanted: int) -> list[tuple[int, int]]:
    """``flock`` (non-blocking) up to ``wanted`` of the lock files ``paths`` (index ->
    path) that nobody holds, in order; (index, fd) pairs.  Job slots and GPU devices
    (``supervise.acquire_gpus``) are both taken this way."""
    got: list[tuple[int, int]] = []
    for index, path in paths.items():
        fd = open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        got.append((index, fd))
        if len(got) == wanted:
            break
    return got


def try_take(slots_dir: str, limit: int, ticket: str) -> tuple[tuple[int, int] | None, int]:
    """One scan: ((slot index, fd), 0) when ``ticket`` may start, else (None, jobs
    ahead of it).  Behind ``limit`` live tickets it cannot start: no lock taken."""
    names = waiting(slots_dir)
    ahead = _live_ahead(slots_dir, names[: ahead_of(names, ticket)], limit)
    if ahead >= limit:
        return None, ahead
    with flocked(os.path.join(slots_dir, ALLOC_LOCK)):
        names = waiting(slots_dir)  # again, under the lock: what the slots are tried against
        ahead = _live_ahead(slots_dir, names[: ahead_of(names, ticket)], limit)
        free = _free_slots(slots_dir, limit, ahead + 1) if ahead < limit else []
        if len(free) > ahead:  # a free slot for each job ahead, and one for this one
            for _, fd in free[1:]:
                os.close(fd)
            return free[0], 0
        for _, fd in free:
            os.close(fd)
        return None, ahead


def must_wait(slots_dir: str, limit: int, ticket: str) -> bool:
    """Whether ``ticket`` would wait if its supervisor looked now (the submitter asks,
    so a job that will queue reads as queued from its submit on): no slot is taken."""
    with flocked(os.path.join(slots_dir, ALLOC_LOCK)):
        names = waiting(slots_dir)
        ahead = ahead_of(names, ticket)
        free = _free_slots(slots_dir, limit, ahead + 1) if ahead < limit else []
        for _, fd in free:
            os.close(fd)
        return len(free) <= ahead


def acquire(
    slots_dir: str, limit: int, ticket: str, on_wait: Callable[[int], None]
) -> tuple[int, int]:
    """Wait for a slot in ticket order; returns (slot index, the fd holding it).
    ``on_wait(jobs ahead)`` is called whenever that number changes while waiting."""
    delay, said = RETRY_S[0], -1
    while True:
        got, ahead = try_take(slots_dir, limit, ticket)
        if got is not None:
            return got
        if ahead != said:
            on_wait(ahead)
            said = ahead
        time.sleep(delay)
        delay = min(delay * 2, RETRY_S[0 if not ahead else 1 if ahead < limit else 2])


@contextlib.contextmanager
def flocked(path: str) -> Iterator[None]:
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def open_lock(path: str) -> int:
    """Read-only is enough to flock, so a lock file any user made serves every user."""
    return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
