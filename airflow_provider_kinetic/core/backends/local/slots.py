"""``[kinetic] local_max_jobs``: the local backend's side of the machine-wide job limit.

At most ``local_max_jobs`` local jobs run at once on a machine, across every task,
batch, DAG run and Airflow process there (the default: the CPUs this process may run
on).  The slots and the FIFO queue are files in one directory per machine, ``flock``ed
(:mod:`~airflow_provider_kinetic.core.backends.local.slot_queue`, which the supervisor
imports); here is what the backend does with them:

- at submit, a job takes a ticket (in submit order) and hands its locked fd to its
  supervisor, which waits in the queue *before* it starts the job: the supervisor is
  a detached process, so a queued job keeps its place when the Airflow worker that
  submitted it dies, and a queued job is a cheap process, not a running one;
- while it waits, the job's status is PENDING, "queued: N jobs ahead", counted from
  one listing of the queue (``batch_status`` lists it once for all its children),
  then its place and what it waits for: "; position 2 of 3; slot held by job-a"
  (the jobs of this store that hold a slot of the same machine-wide dir: their own
  ``slot`` file, no exit code yet; the others are "elsewhere");
- cancel and release take the ticket out of the queue (a dead supervisor's ticket is
  also removed by the next supervisor that finds its lock free).

GPU jobs take no slot: each already holds its devices (``local/gpus.py``), which bound
them per device, and a slot would make a GPU job wait for CPU jobs (or take a CPU
job's place) while its GPUs stand idle.  A GPU job run on the CPU (no GPU here) is
a CPU job and takes one.

The value comes from the Airflow layer (``deployment/backends.py`` sets
``LocalBackend.max_jobs``); plain Python (and the test suite) may set
``KINETIC_LOCAL_MAX_JOBS``; the directory is ``KINETIC_LOCAL_SLOTS`` when set.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

from airflow_provider_kinetic.core.backends.local import slot_queue
from airflow_provider_kinetic.core.backends.local.slot_queue import SLOT_FILE, SLOTS_FILE, WAIT_FILE
from airflow_provider_kinetic.core.backends.local.supervise import HOST_TMPDIR_ENV
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport

#: The limit where the Airflow option does not say (plain Python, the test suite).
MAX_JOBS_ENV = "KINETIC_LOCAL_MAX_JOBS"
#: The machine-wide slots directory (default ``{host temp dir}/kinetic-slots``).
SLOTS_ENV = "KINETIC_LOCAL_SLOTS"


class LocalMaxJobsError(KineticError, ValueError):
    """A job limit that is not a whole number of at least 1."""


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity: a cpuset's or ``taskset``'s share,
    not the host's count), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_max_jobs(value: int | str | None = None) -> int:
    """The limit: ``value`` (the Airflow option) when given, else ``KINETIC_LOCAL_MAX_JOBS``,
    else :func:`machine_cpus`.

    Raises:
        LocalMaxJobsError: not a whole number of at least 1.
    """
    source = "[kinetic] local_max_jobs"
    if value is None or value == "":
        value, source = os.environ.get(MAX_JOBS_ENV) or None, MAX_JOBS_ENV
    if value is None:
        return machine_cpus()
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise LocalMaxJobsError(f"{source} must be a whole number of at least 1, not {value!r}")
    return int(text)


def slots_dir() -> str:
    """Where every local job of this machine takes its slot (one dir per machine, as the
    GPU locks: two connections with different roots share the machine's CPUs)."""
    configured = os.environ.get(SLOTS_ENV)
    if configured:
        return os.path.abspath(configured)
    base = os.environ.get(HOST_TMPDIR_ENV) or tempfile.gettempdir()
    return os.path.join(base, "kinetic-slots")


def take_ticket(jdir: str, limit: int) -> int:
    """Queue the job in ``jdir`` (before its supervisor starts: submit order) and write
    its request; returns the fd holding the ticket's lock, for the supervisor to
    inherit (the caller closes its own copy once the supervisor is started)."""
    where = slots_dir()
    slot_queue.make_dir(where)
    ticket = slot_queue.ticket_name()
    fd = slot_queue.open_ticket(where, ticket, jdir)
    request = {"dir": where, "limit": limit, "ticket": ticket, "fd": fd}
    try:
        with open(os.path.join(jdir, SLOTS_FILE), "w") as f:
            json.dump(request, f)
        if slot_queue.must_wait(where, limit, ticket):  # queued from the start, not RUNNING
            with open(os.path.join(jdir, WAIT_FILE), "w"):
                pass
    except BaseException:
        slot_queue.remove(where, ticket)
        os.close(fd)
        raise
    return fd


def read_request(jdir: str) -> dict | None:
    """The job's slot request, or None for a job that takes no slot."""
    try:
        with open(os.path.join(jdir, SLOTS_FILE)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def queued_report(jdir: str, listings: dict[str, list[str]] | None = None) -> StatusReport | None:
    """PENDING, "queued: N jobs ahead", while a live job's supervisor waits for a slot
    (or, from submit on, when its submitter saw it would); None once it has one, for a
    job that takes none, and for one that got its slot at once (read as RUNNING from
    its submit on, as before the limit).  ``listings`` caches the queue's listing per
    slots dir: a batch's children share one listing."""
    if not os.path.exists(os.path.join(jdir, WAIT_FILE)):
        return None
    if os.path.exists(os.path.join(jdir, SLOT_FILE)):
        return None
    request = read_request(jdir)
    if request is None:
        return None
    where = request["dir"]
    if listings is None:
        names = slot_queue.waiting(where)
    elif where in listings:
        names = listings[where]
    else:
        names = listings[where] = slot_queue.waiting(where)
    if os.path.exists(os.path.join(jdir, SLOT_FILE)):  # got it since the first look
        return None
    ahead = slot_queue.ahead_of(names, request["ticket"])
    message = slot_queue.queued_message(ahead, request["limit"])
    holders = _holders(os.path.dirname(jdir), where, listings)
    return StatusReport(
        JobStatus.PENDING, message=message + _why(ahead, len(names), request["limit"], holders)
    )


def _holders(jobs_dir: str, where: str, listings: dict[str, list[str]] | None) -> list[str]:
    """The jobs under ``jobs_dir`` (this store's) that hold a slot of ``where``: a
    ``slot`` file and no exit code yet.  Cached in ``listings`` (a batch's children
    share one scan)."""
    key = f"{where}\0holders\0{jobs_dir}"
    if listings is not None and key in listings:
        return listings[key]
    held: list[str] = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(jobs_dir)):
            jdir = os.path.join(jobs_dir, name)
            if not os.path.exists(os.path.join(jdir, SLOT_FILE)):
                continue
            if os.path.exists(os.path.join(jdir, "exit_code")):
                continue
            request = read_request(jdir)
            if request is not None and request.get("dir") == where:
                held.append(name)
    if listings is not None:
        listings[key] = held
    return held


def _why(ahead: int, queued: int, limit: int, holders: list[str]) -> str:
    """``; position 2 of 3; slot held by job-a`` (or ``slots held by job-a, job-b``,
    ``and 1 job elsewhere``: another store's, or just ended)."""
    text = f"; position {ahead + 1} of {max(queued, ahead + 1)}"
    if not holders and not limit:
        return text
    shown = holders[:limit]
    names = ", ".join(shown) if shown else ""
    others = max(0, limit - len(shown))
    if others:
        other = f"{others} job{'s' if others != 1 else ''} elsewhere"
        names = f"{names} and {other}" if names else other
    return text + f"; {'slot' if limit == 1 else 'slots'} held by {names}"


def withdraw(jdir: str) -> None:
    """Take a job that never got its slot out of the queue (cancelled, released)."""
    request = read_request(jdir)
    if request is not None and not os.path.exists(os.path.join(jdir, SLOT_FILE)):
        with contextlib.suppress(KeyError):
            slot_queue.remove(request["dir"], request["ticket"])
