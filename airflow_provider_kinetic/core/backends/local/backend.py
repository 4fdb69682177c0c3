"""The embedded local backend: the pod's command, run as a detached local process.

Job state lives on disk under ``{root}/.local-jobs/{job_id}/`` (a 0700 dir: ``pid``,
``exit_code``, ``log``, ``spec.json``, ``cancelled``) so a trigger in another process,
or a retry after the worker died, can read status, logs and results.  The process
is started in its own session (a process group) that outlives the Airflow task
process; ``cancel`` kills the whole group.  Its runner cannot outlive it unseen
(``local/runlock.py``): while a process of the job lives, the job is not over.  At
most ``max_jobs`` (``[kinetic] local_max_jobs``) CPU jobs run at once on the machine;
the others wait, PENDING, in a queue that outlives the worker (``local/slots.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend, TargetConfig, TimedText
from airflow_provider_kinetic.core.backends.local import environ as local_environ
from airflow_provider_kinetic.core.backends.local import gpus as local_gpus
from airflow_provider_kinetic.core.backends.local import logtimes as local_logtimes
from airflow_provider_kinetic.core.backends.local import presence as local_presence
from airflow_provider_kinetic.core.backends.local import reasons as local_reasons
from airflow_provider_kinetic.core.backends.local import runlock as local_runlock
from airflow_provider_kinetic.core.backends.local import slots as local_slots
from airflow_provider_kinetic.core.backends.local import venv as local_venv
from airflow_provider_kinetic.core.backends.local import wake as local_wake
from airflow_provider_kinetic.core.backends.local.presence import supervisor_alive as _alive
from airflow_provider_kinetic.core.backends.local.supervise import (
    GPUS_FILE,
    SECRETS_FILE,
    TMPDIR_FILE,
)
from airflow_provider_kinetic.core.backends.local.supervise import write_atomic as _write_atomic
from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.data.locallinks import LOCAL_MOUNTS_ENV
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.core.storage import LocalStore

log = logging.getLogger(__name__)

STATE_DIR = ".local-jobs"

#: The module the local process runs in place of the image's runner script.
RUNNER_MODULE = "airflow_provider_kinetic.runner"
#: A submit writes ``pid`` moments after making the job dir: this long without, it died.
_START_GRACE_S = 120.0
_STARTING = StatusReport(JobStatus.PENDING, "starting")


def local_devices() -> dict[str, int]:
    """Accelerators visible on this machine (what the local process can really use);
    GPUs as ``local/gpus.py`` finds them (injected list, NVML, ``/dev/nvidiaN``)."""
    names = os.listdir("/dev") if os.path.isdir("/dev") else []
    tpus = [n for n in names if n.startswith("accel") and n[len("accel") :].isdigit()]
    return {"gpu": len(local_gpus.machine_gpus()), "tpu": len(tpus)}


def local_command(spec: JobSpec, python: str | None = None) -> list[str]:
    """The spec's command + args, with the image's runner mapped to this interpreter
    (or to ``python``, the job's requirements venv)."""
    command = spec.command
    if command and command[-1].endswith("remote_runner.py"):
        command = [python or sys.executable, "-u", "-m", RUNNER_MODULE]
    return command + spec.args


def local_env(spec: JobSpec, devices: dict[str, int] | None = None) -> tuple[dict[str, str], str]:
    """The pod's env adjusted to this machine; returns (env overlay, note for the log)."""
    env = spec.env
    env[LOCAL_MOUNTS_ENV] = "1"  # the runner links volumes instead of writing host paths
    devices = local_devices() if devices is None else devices
    accel = spec.accelerator
    gpu_env, gpu_note = local_gpus.gpu_env(accel, devices["gpu"])
    env.update(gpu_env)
    note = gpu_note or f"running {accel.canonical} job on this machine's CPU"
    if accel.kind == "tpu":
        if devices["tpu"]:
            note = f"running {accel.canonical} job on {devices['tpu']} local TPU device(s)"
        else:
            env["JAX_PLATFORMS"] = "cpu"
            note = f"no TPU on this machine: running {accel.canonical} job on the CPU"
    return env, note


class LocalBackend(Backend):
    """Runs jobs as local processes; state and logs on disk under ``root``.  ``max_jobs``:
    the machine-wide limit of running jobs (None: ``local_slots.resolve_max_jobs``'s
    default, the CPU count); the Airflow layer sets it from ``[kinetic] local_max_jobs``.
    ``inherit_env``: jobs inherit the worker's whole environment (``[kinetic]
    local_inherit_env``); else they see what ``local_environ.job_environment`` keeps."""

    name = "local"
    first_poll_s = 0.1  # local jobs often end in well under a second

    def __init__(self, root: str, max_jobs: int | None = None, inherit_env: bool = False):
        self.root = os.path.abspath(root)
        self.max_jobs = max_jobs
        self.inherit_env = inherit_env

    # ---- the kind ---------------------------------------------------------------
    @classmethod
    def preflight(cls, accelerator: Accelerator, requested: str | None = None) -> None:
        """A GPU job must fit this machine's GPUs (model and count), before anything
        is uploaded; ``requested`` (the string as written) lets a bare count take any
        model.  A machine without GPUs runs GPU jobs on the CPU, as it always did."""
        any_model = requested is not None and local_gpus.is_bare(requested)
        local_gpus.plan_gpus(accelerator, any_model=any_model)

    @classmethod
    def validate_config(cls, config: TargetConfig) -> None:
        if not config.root:
            raise ValueError("the local backend needs a root directory ('root' extra)")

    @classmethod
    def bucket_for(cls, config: TargetConfig) -> str:
        return os.path.abspath(config.root or "")

    @classmethod
    def store_for(cls, config: TargetConfig) -> LocalStore:
        return LocalStore(cls.bucket_for(config))

    @classmethod
    def from_config(
        cls, config: TargetConfig, api_client_factory: Callable[[], Any] | None = None
    ) -> LocalBackend:
        return cls(cls.bucket_for(config))

    @classmethod
    def manifest(cls, spec: JobSpec) -> dict[str, Any]:
        env, note = local_env(spec)
        manifest = {"kind": "LocalProcess", "argv": local_command(spec), "env": env, "note": note}
        gpus = local_gpus.plan_gpus(spec.accelerator, fallback=True)
        if gpus is not None:
            manifest["gpus"] = gpus.request(local_gpus.lock_dir())
        if spec.secrets:  # names only: the values travel in a 0600 file
            manifest["secret_env"] = {name: SECRETS_FILE for name in sorted(spec.secrets)}
        return manifest

    def job_dir(self, job_id: str) -> str:
        return os.path.join(self.root, STATE_DIR, job_id)

    # ---- submit ---------------------------------------------------------------
    def submit(self, spec: JobSpec) -> None:
        # What the preflight checked, again for callers that skip it: before job state.
        gpus = local_gpus.plan_gpus(spec.accelerator, fallback=True)
        limit = local_slots.resolve_max_jobs(self.max_jobs)  # a bad value fails here
        # The image's stand-in first: a requirement uv cannot install fails the submit
        # (as the image build would), before any job state exists.
        venv = local_venv.ensure_venv(self.root, spec.requirements) if spec.requirements else None
        jdir = self.job_dir(spec.job_id)
        os.makedirs(os.path.dirname(jdir), exist_ok=True)
        os.mkdir(jdir, 0o700)  # a second submit of the same id must fail, not double-run
        argv = local_command(spec, local_venv.venv_python(venv) if venv else None)
        overlay, note = local_env(spec)
        if venv:
            overlay["VIRTUAL_ENV"] = venv
            note += f", in the requirements venv {venv}"
        log.info("local backend: %s", note)
        with _private(os.path.join(jdir, "spec.json")) as f:
            # "python": the supervisor's interpreter, named if it cannot start the job.
            record = {"argv": argv, "env": overlay, "name": spec.name, "python": sys.executable}
            json.dump(record, f, indent=2)
        if gpus is not None:  # locked by the supervisor for the job's whole life
            with _private(os.path.join(jdir, GPUS_FILE)) as f:
                json.dump(gpus.request(local_gpus.lock_dir()), f)
        if spec.secrets:  # read (and deleted at the end) by the supervisor
            with _private(os.path.join(jdir, SECRETS_FILE)) as f:
                json.dump(spec.secrets, f)
        # The worker's runtime, not its settings and secrets (``local/environ.py``); the
        # captured secrets join in the supervisor, from the 0600 file.
        overlay_env = {**overlay, "PYTHONUNBUFFERED": "1"}
        env = local_environ.job_environment(os.environ, overlay_env, inherit=self.inherit_env)
        if venv:  # the venv is the job's whole environment, as the image is a pod's
            env.pop("PYTHONPATH", None)
        # A GPU job's devices bound it (local_slots): a CPU job queues for a slot, in
        # submit order, its ticket's lock handed to the supervisor that waits on it.
        ticket_fd = local_slots.take_ticket(jdir, limit) if gpus is None else None
        log_file = open(os.path.join(jdir, "log"), "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "airflow_provider_kinetic.core.backends.local.supervise",
                    jdir,
                    "--",
                    *argv,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=jdir,
                start_new_session=True,
                pass_fds=() if ticket_fd is None else (ticket_fd,),
            )
        except BaseException:
            local_slots.withdraw(jdir)
            raise
        finally:
            log_file.close()
            if ticket_fd is not None:
                os.close(ticket_fd)  # the supervisor's copy holds the ticket now
        _write_atomic(os.path.join(jdir, "pid"), str(proc.pid))
        # Reap the child if this process outlives it, so it never lingers as a zombie.
        threading.Thread(target=proc.wait, name=f"reap-{spec.job_id}", daemon=True).start()

    # ---- status ---------------------------------------------------------------
    def status(
        self, handle: JobHandle, listings: dict[str, list[str]] | None = None
    ) -> StatusReport:
        """``listings``: the slot queue's listing, shared by a batch's children."""
        jdir = self.job_dir(handle.job_id)
        if not os.path.isdir(jdir):
            # NOT_FOUND only when it is: a live job or an unreadable store raises
            # StoreUnavailable, which polls retry (``local/presence.py``).
            local_presence.check_gone(self.root, os.path.dirname(jdir), [handle.job_id])
            return StatusReport(JobStatus.NOT_FOUND, "no such local job")
        code = _read(os.path.join(jdir, "exit_code"))
        cancelled = os.path.exists(os.path.join(jdir, "cancelled"))
        if code is not None:
            if int(code) == 0:
                return StatusReport(JobStatus.SUCCEEDED)
            reason = "cancelled" if cancelled else local_reasons.exited(jdir, int(code))
            return StatusReport(JobStatus.FAILED, reason)
        pid = _read(os.path.join(jdir, "pid"))
        if pid is None:
            why = local_reasons.unstarted(jdir, _START_GRACE_S)  # its submitter died?
            return StatusReport(JobStatus.FAILED, why) if why else _STARTING
        if _alive(int(pid), jdir):  # PENDING while it waits for its GPUs or a job slot
            queued = local_gpus.queued_report(jdir) or local_slots.queued_report(jdir, listings)
            return queued or StatusReport(JobStatus.RUNNING)
        # Re-read: the supervisor may have written its exit code as it exited.
        code = _read(os.path.join(jdir, "exit_code"))
        if code is not None:
            return self.status(handle, listings)
        if local_runlock.held(jdir):  # its supervisor died: end what it left, then FAILED
            local_runlock.end_orphans(int(pid), jdir)
            return StatusReport(JobStatus.RUNNING, "supervisor gone: ending its runner")
        reason = "cancelled" if cancelled else local_reasons.vanished(jdir)
        return StatusReport(JobStatus.FAILED, reason)

    def batch_status(self, group_id: str, handles: list[JobHandle]) -> dict[str, StatusReport]:
        """The on-disk state of each job (and at most one listing of the slot queue).
        Presence is checked per job, not by listing the state dir: that dir holds every
        job the store ever ran (a batch of 10,000 leaves 10,000), so a listing per poll
        made a batch's polls O(N) each."""
        present = {h.job_id for h in handles if os.path.isdir(self.job_dir(h.job_id))}
        missing = [h.job_id for h in handles if h.job_id not in present]
        local_presence.check_gone(self.root, os.path.join(self.root, STATE_DIR), missing)
        listings: dict[str, list[str]] = {}
        return {
            h.job_id: self.status(h, listings)
            if h.job_id in present
            else StatusReport(JobStatus.NOT_FOUND, "no such local job")
            for h in handles
        }

    def read_logs(
        self, handle: JobHandle, offset: int = 0, max_bytes: int | None = None
    ) -> tuple[str, int]:
        """Whole lines after byte ``offset``; with ``max_bytes`` only that much is read
        from the file, and a line longer than that comes in pieces (never split
        inside a character), so a read's cost is bounded whatever the job printed."""
        path = os.path.join(self.job_dir(handle.job_id), "log")
        capped = max_bytes is not None and max_bytes > 0
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(max_bytes if capped else -1)
        except FileNotFoundError:
            return "", offset
        # Only whole lines: a partial last line is shown on the next read ...
        cut = data.rfind(b"\n") + 1
        if not cut and capped and len(data) >= max_bytes:
            cut = _char_boundary(data)  # ... unless it alone fills the cap
        text = data[:cut].decode("utf-8", "replace")
        times = local_logtimes.times_for(self.job_dir(handle.job_id), offset, text)
        return (TimedText(text, times) if times else text), offset + cut

    # ---- waiting: wake as soon as a job's supervisor writes its exit code ------------
    def _any_ended(self, handles: list[JobHandle]) -> bool:
        return any(
            os.path.exists(os.path.join(self.job_dir(h.job_id), "exit_code")) for h in handles
        )

    def wait(self, handles: list[JobHandle], seconds: float) -> None:
        """Until a job ends (its supervisor's exit, ``local/wake.py``) or ``seconds`` pass."""
        jdirs = [self.job_dir(h.job_id) for h in handles]
        local_wake.wait(lambda: self._any_ended(handles), jdirs, seconds)

    async def await_change(self, handles: list[JobHandle], seconds: float) -> None:
        jdirs = [self.job_dir(h.job_id) for h in handles]
        await local_wake.await_change(lambda: self._any_ended(handles), jdirs, seconds)

    def venvs_in_use(self) -> set[str]:
        """Requirements venvs of local jobs that have not ended (starting or running):
        ``data gc`` must not remove them."""
        try:
            jdirs = [e.path for e in os.scandir(os.path.join(self.root, STATE_DIR)) if e.is_dir()]
        except FileNotFoundError:
            return set()
        used = set()
        for jdir in jdirs:
            if _read(os.path.join(jdir, "exit_code")) is not None:
                continue
            pid = _read(os.path.join(jdir, "pid"))
            if pid is not None and not _lives(int(pid), jdir):
                continue  # killed without an exit code: nothing runs in its venv
            try:
                with open(os.path.join(jdir, "spec.json")) as f:
                    venv = json.load(f).get("env", {}).get("VIRTUAL_ENV")
            except (OSError, ValueError):
                continue
            if venv:
                used.add(venv)
        return used

    #: The log file goes with the job dir: the history keeps a copy (``release``).
    keeps_logs = False

    def release(self, handle: JobHandle) -> None:
        """Remove an ended job's state dir and whatever its temp dir still holds (a
        supervisor that was itself killed could not); a live job keeps both."""
        jdir = self.job_dir(handle.job_id)
        pid = _read(os.path.join(jdir, "pid"))
        ended = _read(os.path.join(jdir, "exit_code")) is not None
        if pid is not None and not ended and _lives(int(pid), jdir):
            return
        local_slots.withdraw(jdir)  # killed while queued: its ticket goes too
        tmp_dir = _read(os.path.join(jdir, TMPDIR_FILE))
        if tmp_dir and os.path.basename(tmp_dir).startswith("kinetic-job-"):
            shutil.rmtree(tmp_dir, ignore_errors=True)
        shutil.rmtree(jdir, ignore_errors=True)

    def cancel(self, handle: JobHandle) -> None:
        jdir = self.job_dir(handle.job_id)
        pid = _read(os.path.join(jdir, "pid"))
        if pid is None or _read(os.path.join(jdir, "exit_code")) is not None:
            return
        if not _lives(int(pid), jdir):
            return  # already ended; the pid (and its group id) may belong to another process
        _write_atomic(os.path.join(jdir, "cancelled"), str(time.time()))
        local_runlock.kill_group(int(pid))
        local_slots.withdraw(jdir)  # a queued job leaves the queue (its SIGTERM did too)


def _lives(pid: int, jdir: str) -> bool:
    """Whether a process of the job lives: its supervisor, or (the supervisor killed)
    its runner or what that forked, which hold the run lock (``local/runlock.py``)."""
    return _alive(pid, jdir) or local_runlock.held(jdir)


def _char_boundary(data: bytes) -> int:
    """The end of the last whole UTF-8 character in ``data`` (a piece of a long line
    ends there; the next read starts with the rest of the character)."""
    end = len(data)
    start = end - 1
    while start > 0 and end - start < 4 and data[start] & 0xC0 == 0x80:
        start -= 1  # back over continuation bytes to the character's first byte
    lead = data[start]
    need = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return end if start + need <= end or start == 0 else start


def _private(path: str) -> Any:
    """A new file only the owner can read (0600, whatever the umask)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None
