"""Venvs for local jobs with requirements: the local rehearsal of the job's image.

In a pod the task's requirements are baked into (or installed at the start of) the
image; on the local backend the job runs in a venv built with ``uv`` from the same
lines, so a missing or misspelt dependency fails here with uv's own error, as the
image build would, instead of silently using whatever the Airflow worker has.

A venv is built once per requirements hash (lines + this interpreter) under
``{root}/.local-venvs/{hash}``: under a file lock, in a scratch directory that is
renamed into place only when complete (``uv venv --relocatable``), so a half-built
venv is never used and concurrent jobs wait for one build instead of racing.  Each
use touches the venv (under the same lock), so ``airflow kinetic data gc`` can
remove venvs unused for a while (:func:`collect`) without pulling one from under a
job that is about to start or still running.

What the runner itself needs comes from the worker's environment, offline: a
``.pth`` file puts a directory of links to this package and ``cloudpickle`` *after*
the venv's own site-packages (a pinned ``cloudpickle`` in the requirements wins).
``google-cloud-storage`` is not linked: the local backend's store is ``file://``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from airflow_provider_kinetic.core.errors import KineticError

log = logging.getLogger(__name__)

VENV_DIR = ".local-venvs"
SHIM_DIR = "kinetic-runner"
#: Packages the runner imports, linked from the worker's environment.
RUNNER_PACKAGES = ("airflow_provider_kinetic", "cloudpickle")
#: Wheel directories (whitespace-separated) to install from *instead of* the package
#: index: air-gapped workers, and tests that must not touch the network.
FIND_LINKS_ENV = "KINETIC_LOCAL_FIND_LINKS"
#: The tail of uv's output kept in the error (the resolver's explanation is at the end).
_ERROR_TAIL = 4000


class LocalVenvError(KineticError, RuntimeError):
    """The venv for a local job's requirements could not be built (uv's error inside)."""

    #: The phase a job fails in when this rejects its submit (``core.spec.failure``).
    failure_phase = "requirements install"


def package_count(lines: Sequence[str]) -> int:
    """Lines that name something to install (not blank, comment or option lines)."""
    return sum(1 for line in lines if line.strip() and not line.strip().startswith(("#", "-")))


def requirements_hash(lines: Sequence[str]) -> str:
    """The venv's identity: the requirement lines and the interpreter that runs them
    (pickled code needs the worker's Python minor version)."""
    h = hashlib.sha256()
    h.update(f"python={os.path.realpath(sys.executable)} {platform.python_version()}\n".encode())
    h.update(f"find-links={' '.join(find_links())}\n".encode())
    for line in lines:
        h.update(line.strip().encode() + b"\n")
    return h.hexdigest()


def find_links() -> list[str]:
    return os.environ.get(FIND_LINKS_ENV, "").split()


def _source_args() -> list[str]:
    """``--no-index --find-links DIR...`` when a wheelhouse is configured."""
    links = find_links()
    return ["--no-index", *[a for d in links for a in ("--find-links", d)]] if links else []


def uv_command() -> list[str]:
    """``uv`` on PATH, else ``python -m uv`` when the uv package is installed."""
    found = shutil.which("uv")
    if found:
        return [found]
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    raise LocalVenvError(
        "this local job has requirements, and the local backend builds their venv with uv, "
        "which is not installed on this worker: pip install uv (or put uv on PATH)"
    )


def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def ensure_venv(root: str, lines: Sequence[str]) -> str:
    """The venv directory for ``lines``, built (once, under a lock) if missing, and
    touched (under the lock: a concurrent ``gc`` sees the use or has finished)."""
    digest = requirements_hash(lines)
    base = os.path.join(root, VENV_DIR)
    final = os.path.join(base, digest[:24])
    os.makedirs(base, exist_ok=True)
    with _locked(os.path.join(base, f"{digest[:24]}.lock")):
        if os.path.isfile(venv_python(final)):  # built earlier, or while we waited
            with contextlib.suppress(OSError):  # a venv we may not touch is still usable
                os.utime(final)
            log.info("reusing venv %s for requirements %s", final, digest[:12])
            return final
        log.info(
            "building venv for requirements %s (%d packages)…", digest[:12], package_count(lines)
        )
        for stale in glob.glob(os.path.join(base, f".build-{digest[:24]}-*")):
            shutil.rmtree(stale, ignore_errors=True)  # a builder that died (we hold the lock)
        scratch = os.path.join(base, f".build-{digest[:24]}-{os.getpid()}")
        try:
            _build(scratch, lines)
            os.rename(scratch, final)
            os.utime(final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log.info("venv for requirements %s ready: %s", digest[:12], final)
        return final


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _uv(args: list[str], what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")  # the worker's interpreter, nothing else
    proc = subprocess.run(
        [*uv_command(), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        for line in output.splitlines()[-40:]:
            log.error("uv: %s", line)
        raise LocalVenvError(
            f"{what} failed (uv exit {proc.returncode}); the job was not started:\n"
            + output[-_ERROR_TAIL:]
        )


def _build(venv: str, lines: Sequence[str]) -> None:
    _uv(
        ["venv", "--quiet", "--relocatable", "--python", sys.executable, venv],
        "creating the venv",
    )
    reqs = os.path.join(venv, "kinetic-requirements.txt")
    with open(reqs, "w") as f:
        f.write("\n".join(line.rstrip() for line in lines) + "\n")
    if package_count(lines):
        _uv(
            ["pip", "install", "--python", venv_python(venv), *_source_args(), "-r", reqs],
            "installing the job's requirements",
        )
    _link_runner(venv)


def _link_runner(venv: str) -> None:
    """Make the runner importable in the venv without installing it (offline)."""
    shim = os.path.join(venv, SHIM_DIR)
    os.makedirs(shim)
    for name in RUNNER_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise LocalVenvError(f"{name} is not importable on this worker")
        os.symlink(list(spec.submodule_search_locations)[0], os.path.join(shim, name))
    sites = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
    if len(sites) != 1:
        raise LocalVenvError(f"cannot find the site-packages of the venv {venv}: {sites}")
    # A relative .pth line is joined to site-packages: the venv stays relocatable.
    with open(os.path.join(sites[0], "_kinetic_runner.pth"), "w") as f:
        f.write(os.path.relpath(shim, sites[0]) + "\n")


# ---- garbage collection (``airflow kinetic data ls/gc``) ---------------------------

#: A venv used this recently is never collected, whatever ``--older-than`` says: a job
#: that has just been handed it may not have recorded it in its spec yet.
MIN_IDLE_S = 60.0


def idle_enough(idle_s: float, older_than_s: float) -> bool:
    """Whether a venv unused for ``idle_s`` may go under ``gc --older-than``."""
    return idle_s > max(older_than_s, MIN_IDLE_S)


@dataclass
class VenvEntry:
    """One built venv: its requirements hash (24 hex digits), last use, size."""

    path: str
    digest: str
    last_used: float
    files: int
    bytes: int

    def age(self, now: float) -> float:
        return max(0.0, now - self.last_used)


def list_venvs(root: str) -> list[VenvEntry]:
    """Every complete venv under ``root`` (scratch builds are not listed)."""
    base = os.path.join(root, VENV_DIR)
    try:
        names = sorted(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        path = os.path.join(base, name)
        if name.startswith(".") or not os.path.isfile(venv_python(path)):
            continue
        files = size = 0
        for here, _, filenames in os.walk(path):
            for filename in filenames:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(here, filename)).st_size
                    files += 1
        with contextlib.suppress(OSError):
            entries.append(VenvEntry(path, name, os.stat(path).st_mtime, files, size))
    return entries


def collect(entry: VenvEntry, older_than_s: float, in_use: Collection[str]) -> bool:
    """Remove ``entry`` if, under its lock, it is still unused for ``older_than_s``
    (and at least ``MIN_IDLE_S``) and no live job runs in it; whether it was removed.
    It is renamed away under the lock and deleted after, so no job finds half a venv."""
    base = os.path.dirname(entry.path)
    with _locked(os.path.join(base, f"{entry.digest}.lock")):
        try:
            idle = time.time() - os.stat(entry.path).st_mtime
        except FileNotFoundError:
            return False
        if not idle_enough(idle, older_than_s) or entry.path in in_use:
            return False
        trash = os.path.join(base, f".trash-{entry.digest}-{os.getpid()}")
        os.rename(entry.path, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return True
