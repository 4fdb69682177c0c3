"""A local job's process tree lives and dies together.

The supervisor (``local/supervise.py``) runs the job's runner as its child, in its own
session (one process group).  Were the supervisor killed (SIGKILL, the OOM killer),
its runner used to run on, unseen: the status read FAILED, a retry started a second
runner beside it, and the orphan later wrote into a job dir that had been released.
Two things now tie them:

* the runner dies with its supervisor: ``PR_SET_PDEATHSIG`` (Linux, through
  ``prctl``) makes the kernel send it SIGKILL when the supervisor ends, and a runner
  whose supervisor died before that was set kills itself at once;
* the run lock: before anything else the supervisor takes an exclusive ``flock`` on
  ``{job dir}/run.lock`` and hands the fd to the runner, so the lock is held while
  either lives (or any process the runner forked with the fd).  A job whose
  supervisor is gone but whose lock is held still runs: its status is RUNNING, a
  retry adopts it instead of starting a second runner, ``release`` keeps its dir, and
  the status ends what was left (``end_orphans``) so the job then ends.

Standard library only: the supervisor imports it at every job's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable

#: The lock file in the job dir, held by the supervisor and its runner.
LOCK_FILE = "run.lock"
_PR_SET_PDEATHSIG = 1
#: How long a group gets to end after SIGTERM before SIGKILL (cancel).
CANCEL_GRACE_S = 5.0


def hold(jdir: str) -> int:
    """Take the job's run lock; returns its fd (to pass to the runner)."""
    fd = os.open(os.path.join(jdir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def held(jdir: str) -> bool:
    """Whether a process of the job (its supervisor, its runner, or one they forked)
    still holds the run lock.  False for a job that never took it."""
    try:
        fd = os.open(os.path.join(jdir, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # a lock taken here goes with the fd
    return False


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process ends (and
    end at once if it already has); None where ``prctl`` is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:  # resolved before the fork (the process's own libc): the child only calls it
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: die now
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def end_orphans(pgid: int, jdir: str) -> None:
    """SIGKILL what is left of a job whose supervisor is gone.  Only while its run
    lock is held: a live process of the job keeps its group id (the supervisor's pid)
    from being reused, so the signal cannot reach another group."""
    if held(jdir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def kill_group(pgid: int) -> None:
    """SIGTERM the group, then SIGKILL what is left after the grace (cancel)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + CANCEL_GRACE_S
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
