"""Venvs for local jobs with requirements: the local rehearsal of the job's image.

In a pod the task's requirements are baked into (or installed at the start of) the
image; on the local backend the job runs in a venv built with ``uv`` from the same
lines, so a missing or misspelt dependency fails here with uv's own error, as the
image build would, instead of silently using whatever the Airflow worker has.

A venv is built once per requirements hash (lines + this interpreter) under
``{root}/.local-venvs/{hash}``: under a file lock, in a scratch directory that is
renamed into place only when complete (``uv venv --relocatable``), so a half-built
venv is never used and concurrent jobs wait for one build instead of racing.

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
from collections.abc import Iterator, Sequence

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
    """The venv directory for ``lines``, built (once, under a lock) if missing."""
    digest = requirements_hash(lines)
    base = os.path.join(root, VENV_DIR)
    final = os.path.join(base, digest[:24])
    if os.path.isfile(venv_python(final)):
        log.info("reusing venv %s for requirements %s", final, digest[:12])
        return final
    os.makedirs(base, exist_ok=True)
    with _locked(os.path.join(base, f"{digest[:24]}.lock")):
        if os.path.isfile(venv_python(final)):  # built by another job while we waited
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
