"""The package as a user installs it: a wheel built from this checkout, installed with
its ``[gke]`` extra into a clean venv, is found by ``airflow providers get``.

The venv's packages come from the lock (as constraints), which uv links from its
cache, so the test needs no more of the package index than the test command did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.timeout(1200)
def test_wheel_with_gke_extra_in_a_clean_venv_passes_providers_get(tmp_path: Path):
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    shutil.copytree(
        REPO / "airflow_provider_kinetic",
        src / "airflow_provider_kinetic",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    dist = tmp_path / "dist"
    # The build backend (setuptools) from this venv: no build-time download.
    _run(
        [*_uv(), "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "--out-dir", str(dist), str(src)],
    )  # fmt: skip
    (wheel,) = dist.glob("airflow_provider_kinetic-*.whl")
    venv = tmp_path / "venv"
    _run([*_uv(), "venv", "--quiet", "--python", sys.executable, str(venv)])
    python = venv / "bin" / "python"
    find_links = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    extra = ["--find-links", find_links] if find_links else []
    _run(
        [*_uv(), "pip", "install", "--quiet", "--python", str(python), *extra,
         "--constraint", str(REPO / "requirements" / "lock.txt"), f"{wheel}[gke]"],
    )  # fmt: skip
    home = tmp_path / "airflow-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "_AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(home), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"})
    out = _run(
        [str(venv / "bin" / "airflow"), "providers", "get", "airflow-provider-kinetic",
         "--full", "-o", "json"],
        env=env, cwd=tmp_path,
    )  # fmt: skip
    info = json.loads(out.stdout)
    info = info[0] if isinstance(info, list) else info
    assert info["package-name"] == "airflow-provider-kinetic" and "0.1.0" in info["versions"]
    text = json.dumps(info)
    for module in ("operators.run", "operators.map", "sensors.job", "sensors.batch",
                   "triggers.job", "triggers.batch", "hooks.kinetic"):  # fmt: skip
        assert f"airflow_provider_kinetic.{module}" in text, module
    assert "airflow_provider_kinetic.links.KineticJobLink" in text
    (conn,) = info["connection-types"]
    assert conn["connection-type"] == "kinetic" and "gcp_conn_id" in conn["conn-fields"]
    # The wheel's own files, not this checkout's: the package imports from the venv.
    where = _run(
        [str(python), "-c", "import airflow_provider_kinetic as k; print(k.__file__)"],
        env=env, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(venv)), where
    # The stat cache's native comparison was compiled into the wheel (setup.py).
    native = _run(
        [str(python), "-c",
         "from airflow_provider_kinetic.core.data.hashing import fastlstat; "
         "print(fastlstat.available())"],
        env=env, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert native == "True"
