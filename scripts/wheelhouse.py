"""Build ``.artifacts/wheelhouse``: the wheels the runner-image test installs offline.

Why: ``tests/integration/core/runtime/test_runtime_image.py`` builds the runner image's Python
environment from ``docker/Dockerfile.cpu``'s install lines with no network.  Installed
``--offline`` from uv's cache, it passed or failed with what the machine happened to
have cached ("jax==0.10.2 needs to be downloaded from a registry" on a machine whose
cache was filled earlier).  So the test command builds this folder from the package
index, for the Dockerfile's requirements and their dependencies only, every wheel at
its ``requirements/lock.txt`` version (checked here, not assumed), and the test
installs with ``--no-index --find-links`` this folder and ``--no-cache``.

Idempotent and fast when built: a stamp in the folder names what it was built from
(the Dockerfile's requirements, the lock's bytes, the target Python and platform);
when it matches, nothing runs and nothing is fetched.  A stale folder is rebuilt next
to it and swapped in whole, so a failed build leaves the old one and no half folder.
pip comes from ``$PYTHON`` (default ``python3``: the interpreter ``scripts/bootstrap.sh``
builds ``.venv`` from; ``.venv`` has no pip, uv has no ``download``).

Usage: ``.venv/bin/python scripts/wheelhouse.py [--check]``; with ``--check`` nothing
is built: exit 1 with how to build it when it is missing or stale.  Prints its path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = REPO / ".artifacts" / "wheelhouse"
DOCKERFILE = REPO / "docker" / "Dockerfile.cpu"
LOCK = REPO / "requirements" / "lock.txt"
STAMP = "BUILT-FROM"
BUILD = ".venv/bin/python scripts/wheelhouse.py"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[str]:
    """The names the Dockerfile installs from the index (its local wheel is built
    into the image context by the test itself)."""
    names = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("RUN uv pip install"):
            names += [a for a in shlex.split(line)[4:] if not a.startswith("-") and "/" not in a]
    if not names:
        raise SystemExit(f"no 'RUN uv pip install' requirement in {DOCKERFILE}")
    return names


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split(";")[0].split("==")
            pins[_norm(name.strip())] = version.strip()
    return pins


def stamp() -> str:
    """What the folder is built from; a change to any of it means a rebuild."""
    target = f"{sys.version_info.major}.{sys.version_info.minor} {sysconfig.get_platform()}"
    lock = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    return f"requirements: {' '.join(requirements())}\nlock: {lock}\ntarget: {target}\n"


def is_current(folder: Path) -> bool:
    try:
        return (folder / STAMP).read_text() == stamp()
    except OSError:
        return False


def check_pins(folder: Path, pins: dict[str, str]) -> None:
    """Every wheel is at the lock's version (a dependency missing from the lock would
    otherwise come at whatever version the index has today)."""
    wrong = []
    for wheel in sorted(folder.iterdir()):
        if wheel.suffix != ".whl":
            wrong.append(f"{wheel.name} (not a wheel)")
            continue
        name, version = wheel.name.split("-")[:2]
        if pins.get(_norm(name)) != version:
            wrong.append(f"{wheel.name} (lock: {pins.get(_norm(name), 'not pinned')})")
    if wrong:
        raise SystemExit(f"wheels not at {LOCK.name}'s versions: " + ", ".join(wrong))


def build() -> None:
    reqs, pins = requirements(), lock_pins()
    unpinned = [r for r in reqs if _norm(r) not in pins]
    if unpinned:
        raise SystemExit(f"not pinned in {LOCK}: {', '.join(unpinned)}")
    scratch = WHEELHOUSE.with_name(f".wheelhouse-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    pip = [os.environ.get("PYTHON", "python3"), "-m", "pip"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    cmd = [*pip, "download", "--quiet", "--progress-bar", "off", "--only-binary=:all:",
           "--python-version", version, "--constraint", str(LOCK), "--dest", str(scratch),
           *(f"{r}=={pins[_norm(r)]}" for r in reqs)]  # fmt: skip
    try:
        subprocess.run(cmd, check=True)
        check_pins(scratch, pins)
        (scratch / STAMP).write_text(stamp())
        if WHEELHOUSE.exists():
            shutil.rmtree(WHEELHOUSE)
        try:
            scratch.rename(WHEELHOUSE)
        except OSError:  # another build swapped its folder in first
            if not is_current(WHEELHOUSE):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> int:
    if not is_current(WHEELHOUSE):
        if "--check" in argv:
            print(
                f"no current wheelhouse at {WHEELHOUSE} (the runner image's wheels at "
                f"{LOCK.relative_to(REPO)}'s versions): build it with `{BUILD}` "
                "(scripts/test.sh does, before the suite)",
                file=sys.stderr,
            )
            return 1
        build()
    print(WHEELHOUSE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
