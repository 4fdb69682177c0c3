"""Waking as soon as a local job ends: a pidfd of its supervisor (Linux 5.3+).

The supervisor writes the job's exit-code file and then exits, so the moment its
pidfd turns readable the job's outcome is on disk.  A waiting poll loop (the sync
task's, a trigger's) then returns at once instead of at its next look for the file
(every ``WAKE_S``), which was up to 20 ms of every job's end-to-task-end time.

Where no pidfd can be had (another OS, an old kernel, too many jobs to watch, a job
whose supervisor is not known or not alive any more) the caller polls as before: a
pidfd only ever makes a wait shorter.  A pid is trusted only while the process
holding it is the job's supervisor (its command line names the job dir), checked
after the pidfd is opened, so a reused pid is never waited on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import time
from collections.abc import Callable

from airflow_provider_kinetic.core.backends.local.presence import supervisor_alive

#: More jobs than this are polled (a batch's many children): one fd each is not free.
MAX_PIDFDS = 16
#: How often a poll loop looks for a local job's exit-code file (where no pidfd).
WAKE_S = 0.02


def wait(ended: Callable[[], bool], jdirs: list[str], seconds: float) -> None:
    """Until ``ended()`` (any of the jobs' exit codes is written), one of their
    supervisors exits, or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    if ended():
        return
    fds = open_pidfds(jdirs)
    if fds is GONE:  # a supervisor died before it could be watched: a change now
        time.sleep(min(WAKE_S, seconds))
        return
    if fds is not None:
        try:
            wait_any(fds, seconds)
        finally:
            close(fds)
        return
    while not ended() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(WAKE_S, left))


async def await_change(ended: Callable[[], bool], jdirs: list[str], seconds: float) -> None:
    """``wait`` for an event loop (a trigger's): nothing blocks the loop."""
    deadline = time.monotonic() + seconds
    if ended():
        return
    fds = open_pidfds(jdirs)
    if fds is GONE:
        await asyncio.sleep(min(WAKE_S, seconds))
        return
    if fds is not None:
        try:
            await await_any(fds, seconds)
        finally:
            close(fds)
        return
    while not ended() and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(WAKE_S, left))


#: ``open_pidfds``: a job's supervisor is not alive (killed before it could be
#: watched, or its pid now someone else's): the caller returns and reads the status,
#: instead of polling for an exit code a killed supervisor never writes.
GONE: list[int] = []


def open_pidfds(jdirs: list[str]) -> list[int] | None:
    """A pidfd per job dir's live supervisor, ``GONE`` when one of them is not alive,
    or None when one cannot be had (poll instead)."""
    if not hasattr(os, "pidfd_open") or not jdirs or len(jdirs) > MAX_PIDFDS:
        return None
    fds: list[int] = []
    try:
        for jdir in jdirs:
            with open(os.path.join(jdir, "pid")) as f:
                pid = int(f.read().strip())
            fds.append(os.pidfd_open(pid))
            if not supervisor_alive(pid, jdir):  # ended meanwhile, or not ours
                raise ProcessLookupError(pid)
    except ProcessLookupError:
        close(fds)
        return GONE
    except (OSError, ValueError):
        close(fds)
        return None
    return fds


def close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def wait_any(fds: list[int], seconds: float) -> bool:
    """Block until one of the supervisors exits (True) or ``seconds`` pass (False)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(seconds * 1000))))


async def await_any(fds: list[int], seconds: float) -> bool:
    """``wait_any`` on the running loop: the fds are watched by its selector."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def done() -> None:
        if not ended.done():
            ended.set_result(True)

    for fd in fds:
        loop.add_reader(fd, done)
    try:
        return await asyncio.wait_for(ended, timeout=max(0.0, seconds))
    except TimeoutError:
        return False
    finally:
        for fd in fds:
            loop.remove_reader(fd)
