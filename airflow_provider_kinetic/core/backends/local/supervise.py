"""Runs one local job's command and records its exit code on disk.

Started by the local backend as a session leader, so it survives the Airflow task
process; the exit code file is written atomically, after the child has ended, so a
reader never sees a job as finished while it is still writing its result.  The job's
secret env (``secrets.json``, 0600) is read into the child's environment and the file
is deleted when the job ends.  Its output reaches the job's ``log`` through this
process, line by line: masked, and each line's time kept (``logtimes``).  The
runner dies with this process, and holds the job's run lock with it
(``local/runlock.py``): a killed supervisor orphans nothing unseen.

The child gets a temp dir of its own (``TMPDIR``, named in ``{job dir}/tmpdir``) that
the supervisor removes when the child ends, however it ended (``os._exit``, a signal,
a segfault): the runner's work dir and whatever the function left in temp go with it.
If the supervisor itself is killed, the local backend's ``release`` removes the dir.

A GPU job (``gpus.json``, from ``local/gpus.py``) first locks its devices: ``flock`` on
one file per device in a machine-wide dir, all or none under a short-held allocation
lock, retried with a bounded backoff while too few are free (the job is then
"queued": ``queued`` says what it waits for).  The lock fds go to the child too, so
the devices stay taken while either process lives and are freed by the kernel
however both end; the child sees only them (``CUDA_VISIBLE_DEVICES``).

Any other job (``slots.json``, from ``local/slots.py``) first waits for one of the
machine's ``[kinetic] local_max_jobs`` slots, in its queue ticket's (submit) order
(``slot_queue``): the slot's lock fd goes to the child the same way.  A SIGTERM
(cancel) while it waits takes its ticket out of the queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from airflow_provider_kinetic.core.backends.local import logtimes, runlock, slot_queue

SECRETS_FILE = "secrets.json"
#: The file in the job dir that names the child's temp dir.
TMPDIR_FILE = "tmpdir"
#: ``core.data.locallinks.HOST_TMPDIR_ENV``, spelled out: this entry point starts once
#: per job and imports only the standard library, ``slot_queue`` and ``runlock`` (which
#: import only that): the data package costs ~25 ms to import.
HOST_TMPDIR_ENV = "KINETIC_HOST_TMPDIR"
#: Shorter values are not masked (as Airflow's masker, which skips very short secrets).
MIN_MASK = 5
#: A GPU job's request: ``count`` of the devices ``indices``, locked in ``lock_dir``.
GPUS_FILE = "gpus.json"
#: What a GPU job waits for while too few devices are free (its status message).
QUEUED_FILE = "queued"
#: The devices a GPU job got (its ``CUDA_VISIBLE_DEVICES``), written before it starts.
ASSIGNED_FILE = "gpus-assigned"
#: First and longest pause between tries for free GPUs (doubling in between).
GPU_RETRY_S = (0.05, 0.5)


def main(argv: list[str]) -> int:
    jdir, sep, *command = argv
    if sep != "--" or not command:
        sys.stderr.write("usage: supervise JOB_DIR -- COMMAND...\n")
        return 2
    # First: while this process or its runner lives, the job is not over (held until
    # this process ends, after the exit code).
    run_lock = runlock.hold(jdir)
    secrets_path = os.path.join(jdir, SECRETS_FILE)
    env = dict(os.environ)
    secrets: dict[str, str] = {}
    if os.path.exists(secrets_path):
        with open(secrets_path) as f:
            secrets = json.load(f)
        env.update(secrets)
    # Secret values never reach the job's log file: the output is masked line by line.
    masks = sorted({v.encode() for v in secrets.values() if len(v) >= MIN_MASK}, key=len)[::-1]
    held: list[int] = []  # lock fds, before the umask: other users' jobs open them too
    if os.path.exists(os.path.join(jdir, slot_queue.SLOTS_FILE)):
        held.append(take_slot(jdir))
    if os.path.exists(os.path.join(jdir, GPUS_FILE)):
        with open(os.path.join(jdir, GPUS_FILE)) as f:
            devices, gpu_fds = acquire_gpus(jdir, json.load(f))
        held += gpu_fds
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    os.umask(0o077)  # whatever the job writes (result, downloads) is owner-only
    tmp_dir = tempfile.mkdtemp(prefix=f"kinetic-job-{os.path.basename(jdir)}-")
    write_atomic(os.path.join(jdir, TMPDIR_FILE), tmp_dir)
    env[HOST_TMPDIR_ENV] = tempfile.gettempdir()  # what jobs share (volume link counts)
    env["TMPDIR"] = tmp_dir
    child = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,  # passed on line by line: masked, each line's time kept
        stderr=subprocess.STDOUT,
        pass_fds=[run_lock, *held],
        preexec_fn=runlock.die_with_parent(),  # this process has one thread
    )

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    _pass_on(child.stdout, masks, logtimes.open_for_append(jdir))
    code = child.wait()
    for fd in held:  # the next queued job need not wait for the clean-up below
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.remove(secrets_path)
    # Before the exit code: a reader that sees the job ended sees its temp files gone.
    shutil.rmtree(tmp_dir, ignore_errors=True)
    write_atomic(os.path.join(jdir, "exit_code"), str(code))
    return code


def _pass_on(lines: Any, masks: list[bytes], times: int) -> None:
    """The child's output into the job's log (this process's stdout), each line
    masked, its offset and time recorded first (``logtimes``)."""
    out = sys.stdout.buffer
    fd = out.fileno()
    for line in lines:
        for value in masks:
            line = line.replace(value, b"***")
        logtimes.record(times, os.lseek(fd, 0, os.SEEK_END), time.time_ns())
        out.write(line)
        out.flush()
    os.close(times)


def take_slot(jdir: str) -> int:
    """Wait in the queue for a job slot; returns the fd that holds it."""
    with open(os.path.join(jdir, slot_queue.SLOTS_FILE)) as f:
        request = json.load(f)
    where, ticket = request["dir"], request["ticket"]
    ticket_fd = _inherited(request.get("fd"), os.path.join(where, slot_queue.QUEUE_DIR, ticket))

    def leave(signum: int, _frame: object) -> None:  # cancelled while queued
        slot_queue.remove(where, ticket)
        os._exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    since = time.monotonic()
    waited = False

    def on_wait(ahead: int) -> None:
        nonlocal waited
        if not waited:  # the job now reads as queued (its status counts the queue)
            write_atomic(os.path.join(jdir, slot_queue.WAIT_FILE), "")
            print(f"kinetic: {slot_queue.queued_message(ahead, request['limit'])}", flush=True)
            waited = True

    index, fd = slot_queue.acquire(where, request["limit"], ticket, on_wait)
    write_atomic(os.path.join(jdir, slot_queue.SLOT_FILE), str(index))
    slot_queue.remove(where, ticket)
    if ticket_fd is not None:
        os.close(ticket_fd)
    signal.signal(signal.SIGTERM, previous)
    if waited:
        print(f"kinetic: job slot free after {time.monotonic() - since:.1f}s queued", flush=True)
    return fd


def _inherited(fd: int | None, path: str) -> int | None:
    """``fd`` when it is the ticket's file (inherited from the submitter), else None."""
    if fd is None:
        return None
    try:
        return fd if os.path.samestat(os.fstat(fd), os.stat(path)) else None
    except OSError:
        return None


def acquire_gpus(jdir: str, request: dict) -> tuple[list[int], list[int]]:
    """Lock ``count`` of the request's devices, waiting while too few are free;
    returns the device indices and the lock fds that hold them."""
    count, indices, lock_dir = request["count"], request["indices"], request["lock_dir"]
    slot_queue.make_shared_dir(lock_dir)
    delay, said = GPU_RETRY_S[0], ""
    while True:
        held, free = _try_lock(lock_dir, indices, count)
        if held:
            break
        what = " ".join(filter(None, [str(count), "free", request.get("what"), "GPU"]))
        message = f"waiting for {what}{'s' * (count > 1)} ({free} of {len(indices)} free)"
        if message != said:
            write_atomic(os.path.join(jdir, QUEUED_FILE), message)
            if not said:
                print(f"kinetic: queued: {message}", flush=True)
            said = message
        time.sleep(delay)
        delay = min(delay * 2, GPU_RETRY_S[1])
    devices = [index for index, _ in held]
    write_atomic(os.path.join(jdir, ASSIGNED_FILE), ",".join(map(str, devices)))
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(jdir, QUEUED_FILE))
    print(f"kinetic: GPU(s) {devices} assigned: CUDA_VISIBLE_DEVICES set", flush=True)
    return devices, [fd for _, fd in held]


def _try_lock(lock_dir: str, indices: list[int], count: int) -> tuple[list[tuple[int, int]], int]:
    """All ``count`` devices or none (so two jobs never each hold half of what both
    need), under the allocation lock; returns (index, fd) pairs and how many were free."""
    with slot_queue.flocked(os.path.join(lock_dir, "alloc.lock")):
        paths = {index: os.path.join(lock_dir, f"gpu-{index}.lock") for index in indices}
        held = slot_queue.lock_free(paths, count)
        if len(held) == count:
            return held, count
        for _, fd in held:
            os.close(fd)
        return [], len(held)


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
