"""``scripts/bootstrap.sh`` skips a venv that is current and redoes one that is not.

Run on a copy of the files the script reads, with a fake ``uv`` first on PATH that
logs its calls (and builds the stat cache's extension on ``pip install -e``, as the
real editable install does): no package index, no real sync, well under a second each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NATIVE = "airflow_provider_kinetic/core/data/hashing"
SO = f"{NATIVE}/_lstatcmp.cpython-311-x86_64-linux-gnu.so"
FAKE_UV = """#!/usr/bin/env bash
echo "$*" >>"$UV_LOG"
[ "${UV_FAIL:-}" = "$2" ] && exit 1
if [ "$1 $2" = "pip install" ]; then touch "%s"; fi
if [ "$1" = venv ]; then ln -sf "$PYTHON" "${@: -1}/bin/python"; fi
exit 0
"""


def _checkout(root: Path) -> Path:
    """The files bootstrap.sh reads, with a fake venv whose python is this one."""
    for name in ("scripts/bootstrap.sh", "pyproject.toml", "setup.py", f"{NATIVE}/_lstatcmp.c"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    (root / "requirements").mkdir()
    (root / "requirements" / "lock.txt").write_text("cloudpickle==3.1.1\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
    tools = root / "tools"
    tools.mkdir()
    (tools / "uv").write_text(FAKE_UV % (root / SO))
    (tools / "uv").chmod(0o755)
    return root


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def _bootstrap(root: Path, **env: str) -> tuple[int, list[str], float]:
    """Run it; (exit code, the uv calls it made, seconds)."""
    log = root / "uv.log"
    log.unlink(missing_ok=True)
    full_env = {
        "PATH": f"{root / 'tools'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "PYTHON": sys.executable,
        "UV_LOG": str(log),
        **env,
    }
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(root / "scripts" / "bootstrap.sh")],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - start
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, calls, took


def test_a_current_venv_is_skipped_and_each_input_change_redoes_it(tmp_path: Path):
    root = _checkout(tmp_path)
    stamp = root / ".venv" / ".bootstrap-stamp"
    rc, calls, _ = _bootstrap(root)
    assert rc == 0 and [c.split()[:2] for c in calls] == [["pip", "sync"], ["pip", "install"]]
    assert f"built: {SO}" in stamp.read_text()
    assert "requirements/lock.txt" in stamp.read_text()

    # Current: nothing runs, not even uv (the fake one is on PATH to count calls).
    rc, calls, took = _bootstrap(root)
    assert (rc, calls) == (0, []) and took < 5, took

    # Each input: the lock, the install's inputs, the extension that was built.
    for change in (
        lambda: (root / "requirements" / "lock.txt").write_text("cloudpickle==3.1.2\n"),
        lambda: _append(root / "pyproject.toml", "# changed"),
        lambda: _append(root / "setup.py", "# changed"),
        lambda: _append(root / NATIVE / "_lstatcmp.c", "/* changed */"),
        lambda: (root / SO).unlink(),
    ):
        change()
        rc, calls, _ = _bootstrap(root)
        assert rc == 0 and len(calls) == 2, calls
        assert _bootstrap(root)[:2] == (0, [])


def test_a_run_that_fails_midway_leaves_no_stamp_and_is_redone(tmp_path: Path):
    root = _checkout(tmp_path)
    stamp = root / ".venv" / ".bootstrap-stamp"
    assert _bootstrap(root)[0] == 0 and stamp.exists()
    (root / "requirements" / "lock.txt").write_text("cloudpickle==3.1.2\n")
    rc, calls, _ = _bootstrap(root, UV_FAIL="sync")
    assert rc != 0 and len(calls) == 1 and not stamp.exists()
    (root / "requirements" / "lock.txt").write_text("cloudpickle==3.1.1\n")  # back again
    rc, calls, _ = _bootstrap(root)
    assert rc == 0 and len(calls) == 2, calls  # the old stamp did not survive


def test_a_venv_whose_python_does_not_run_is_redone(tmp_path: Path):
    root = _checkout(tmp_path)
    assert _bootstrap(root)[0] == 0
    python = root / ".venv" / "bin" / "python"
    python.unlink()
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    rc, calls, _ = _bootstrap(root)  # made again, then synced and installed
    assert rc == 0 and [c.split()[0] for c in calls] == ["venv", "pip", "pip"], calls
    assert _bootstrap(root)[:2] == (0, [])
