"""Whether a local job whose state cannot be seen is really gone.

The local backend keeps a job's state under ``{root}/.local-jobs/{job_id}/``.  When
that directory is missing, NOT_FOUND is the answer only if the store can be read and
no supervisor of the job is alive.  A store on a mount that went away (or left an
empty mount point behind) hides every job in it: a poll that answered NOT_FOUND then
failed the task while the job ran on, unwatched, and wrote a result nobody collected.
Here such a poll raises :class:`~airflow_provider_kinetic.core.storage.StoreUnavailable`
instead, a transient error the polls retry (``core.jobs.polling.StoreOutage``).

A supervisor is found by its command line, which holds its job dir's path whether or
not that path can be seen now (``/proc`` on Linux; elsewhere only the store check
applies).  One scan of ``/proc`` answers for every job asked about.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from airflow_provider_kinetic.core.storage import StoreUnavailable

#: The module the local backend's supervisor runs as (``python -m ...``).
SUPERVISOR_MODULE = "airflow_provider_kinetic.core.backends.local.supervise"
#: How long after its start a supervisor's empty command line means "still in exec".
EXEC_GRACE_S = 10.0


def live_supervisors(state_dir: str) -> dict[str, int]:
    """{job id: pid} of the supervisors alive on this machine for jobs under ``state_dir``
    (a zombie has no command line and is not counted)."""
    prefix = state_dir.rstrip(os.sep) + os.sep
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}
    found: dict[str, int] = {}
    module = SUPERVISOR_MODULE.encode()
    for pid in pids:
        try:
            argv = _cmdline(int(pid)).split(b"\0")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if module not in argv or argv.index(module) + 1 >= len(argv):
            continue
        jdir = os.fsdecode(argv[argv.index(module) + 1])
        if jdir.startswith(prefix) and os.sep not in jdir[len(prefix) :]:
            found[jdir[len(prefix) :]] = int(pid)
    return found


def store_problem(root: str) -> str | None:
    """Why the store at ``root`` cannot be read now, or ``None`` when it can.  (An empty
    root can be read: a store on a mount point left empty by an unmount is covered by
    the supervisor check while its job lives, and a job's runner waits for its store
    before it writes its result, so the job lives until the store is back.)"""
    try:
        with os.scandir(root) as entries:
            next(entries, None)
    except FileNotFoundError:
        return f"the store root {root} does not exist (unmounted, moved or deleted?)"
    except OSError as exc:
        return f"the store root {root} cannot be read ({exc.strerror or exc})"
    return None


def check_gone(root: str, state_dir: str, job_ids: Iterable[str]) -> None:
    """Return when the jobs ``job_ids``, whose state dirs are missing, are really gone;
    raise ``StoreUnavailable`` when one still runs or the store cannot be read."""
    missing = list(job_ids)
    if not missing:
        return
    live = live_supervisors(state_dir)
    running = [job_id for job_id in missing if job_id in live]
    if running:
        raise StoreUnavailable(
            f"local job {running[0]} is still running (supervisor pid {live[running[0]]}) "
            f"but its state dir under {state_dir} cannot be seen: the store is unavailable"
        )
    problem = store_problem(root)
    if problem is not None:
        raise StoreUnavailable(f"cannot tell whether local job {missing[0]} exists: {problem}")


def supervisor_alive(pid: int, jdir: str) -> bool:
    """Whether ``pid`` is still the supervisor of the job in ``jdir`` (not a zombie, not
    a reused pid: its command line names the job dir).

    An empty command line is a process in the middle of ``exec``: ``Popen`` returns
    once exec has closed the child's close-on-exec fds, a moment before the kernel
    sets the new program's arguments.  A status read in that moment (a busy machine
    stretches it) took a just-started job for killed.  It counts as alive while its
    ``pid`` file is younger than ``EXEC_GRACE_S``; an exec never takes that long, so a
    reused pid with no arguments (a kernel thread) is not taken for the job for long."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = f"/proc/{pid}"
    if os.path.isdir(proc):
        try:
            with open(f"{proc}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
            cmdline = _cmdline(pid)
        except (OSError, IndexError):
            return False
        if cmdline:
            return jdir.encode() in cmdline
        return _younger_than(os.path.join(jdir, "pid"), EXEC_GRACE_S)
    return True


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _younger_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < seconds
    except OSError:
        return False
