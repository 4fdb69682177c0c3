"""The README's install from a built wheel: the wheel of this checkout, installed with the
lock's extras into a clean venv, runs the README's example DAG (``retrain_daily`` through
``scripts/run_example.py``, as ``bash scripts/run-example.sh`` does) with ``dag.test()``.

Cheap and offline: the wheel is built with this venv's setuptools (no build isolation,
nothing downloaded); the clean venv gets the lock's packages by links to the ones this
venv already has installed (every entry of its site-packages but this package's own
editable install, which points at the checkout), no package index and no uv cache; the
wheel goes on top with ``--no-deps``, and a check in the new venv says every requirement
of the wheel and of the extras the lock carries is met there.  The DAG runs from a copy
of the example outside the checkout, with no PYTHONPATH, so the provider it imports
(checked: the parent task's and the job's) is the wheel's.  Everything is in tmp_path.
(``test_install.py`` installs wheels from the index's resolution instead, and checks
what a base install without extras lacks.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The extras requirements/lock.in installs (the lock holds what they need).
LOCK_EXTRAS = ("gke", "examples", "tensors")
PACKAGE = "airflow_provider_kinetic"

#: Run in the new venv: where the package is, and which of the wheel's requirements (for
#: the lock's extras) this venv does not meet.
CHECK = """
import importlib.metadata as md, importlib.util, json, sys
from packaging.requirements import Requirement
dist = md.distribution("airflow-provider-kinetic")
unmet = []
for line in dist.requires or []:
    req = Requirement(line)
    extras = [""] + sys.argv[1:]
    if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{line} (installed: {have})")
print(json.dumps({
    "origin": importlib.util.find_spec("airflow_provider_kinetic").origin,
    "dist_files": str(dist.locate_file("")),
    "installer": (dist.read_text("INSTALLER") or "").strip(),
    "direct_url": json.loads(dist.read_text("direct_url.json") or "{}"),
    "unmet": unmet,
}))
"""


def _uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _build_wheel(root: Path) -> Path:
    """This checkout's wheel, built from a copy (setuptools writes build/ and *.egg-info
    beside the sources) with this venv's setuptools, offline."""
    src = root / "src"
    shutil.copytree(
        REPO / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    dist = root / "dist"
    _run(
        [*_uv(), "build", "--wheel", "--no-build-isolation", "--offline", "--no-cache",
         "--python", sys.executable, "--out-dir", str(dist), str(src)],
    )  # fmt: skip
    (wheel,) = dist.glob(f"{PACKAGE}-*.whl")
    return wheel


def _clean_venv(venv: Path) -> tuple[Path, Path]:
    """A new venv holding the lock's packages (links to this venv's installed ones) and
    nothing of this checkout; its python and its site-packages."""
    _run([*_uv(), "venv", "--quiet", "--offline", "--no-cache", "--python", sys.executable,
          str(venv)])  # fmt: skip
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", where]).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    assert ours != site
    for entry in ours.iterdir():
        # This package's editable install (dist-info, finder and .pth point at the checkout).
        if PACKAGE in entry.name or entry.name == "__pycache__":
            continue
        if not (site / entry.name).exists():  # the venv's own _virtualenv.pth stays
            (site / entry.name).symlink_to(entry.resolve())
    return python, site


def _example_tree(root: Path) -> Path:
    """The example as a user runs it, copied out of the checkout: scripts/run_example.py
    and dags_examples/retrain_daily.py (run_example.py finds the DAGs beside its dir)."""
    (root / "scripts").mkdir(parents=True)
    (root / "dags_examples").mkdir()
    shutil.copy(REPO / "scripts" / "run_example.py", root / "scripts" / "run_example.py")
    shutil.copy(REPO / "dags_examples" / "retrain_daily.py", root / "dags_examples")
    return root / "scripts" / "run_example.py"


def _user_env(tmp: Path, venv: Path) -> dict[str, str]:
    """This process's environment without the test session's Airflow, kinetic and
    Python path settings; temp files under tmp."""
    drop = ("AIRFLOW_", "_AIRFLOW", "KINETIC_", "PYTHON", "VIRTUAL_ENV", "UV_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    (tmp / "tmp").mkdir()
    env.update(
        {
            "AIRFLOW_HOME": str(tmp / "airflow-home"),
            "TMPDIR": str(tmp / "tmp"),
            "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        }
    )
    return env


def test_the_built_wheel_in_a_clean_venv_runs_the_example_dag(tmp_path: Path):
    wheel = _build_wheel(tmp_path / "build")
    assert "-cp3" in wheel.name  # setup.py's C extension is in it (a platform wheel)
    venv = tmp_path / "venv"
    python, site = _clean_venv(venv)
    _run(
        [*_uv(), "pip", "install", "--quiet", "--offline", "--no-cache", "--no-deps",
         "--compile-bytecode", "--python", str(python), f"{wheel}[{','.join(LOCK_EXTRAS)}]"],
    )  # fmt: skip
    env = _user_env(tmp_path, venv)
    run_dir = tmp_path / "cwd"  # outside the checkout: nothing of it on sys.path
    run_dir.mkdir()

    checked = _run([str(python), "-c", CHECK, *LOCK_EXTRAS], env=env, cwd=run_dir)
    check = json.loads(checked.stdout)
    assert check["origin"] == f"{site}/{PACKAGE}/__init__.py", check
    assert check["dist_files"] == str(site) and check["installer"] == "uv", check
    assert check["direct_url"]["url"].endswith(wheel.name), check  # the wheel, not -e .
    assert check["unmet"] == [], check["unmet"]

    script = _example_tree(tmp_path / "example")
    done = subprocess.run(
        [str(python), str(script)],
        capture_output=True, text=True, env=env, cwd=run_dir, timeout=600,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert re.search(r"^DAG run manual__\S+: success$", out, re.M), out[-3000:]
    # The DAG's own process imported the wheel's package, not the checkout's.
    assert f"provider:    {site}/{PACKAGE}\n" in out, out[-3000:]
    metrics = json.loads(out.split("metrics:", 1)[1].strip().splitlines()[0])
    assert metrics["rows"] == 512 and metrics["epochs"] == 200
    assert metrics["final_loss"] < metrics["initial_loss"] / 100, metrics
    job = json.loads(out.split("kinetic job:", 1)[1].strip().splitlines()[0])
    assert job["backend"] == "local", job
    # The job ran in the new venv's interpreter (the worker's: no requirements venv was
    # built), started with this environment (no PYTHONPATH) outside the checkout.
    assert not (tmp_path / "airflow-home" / "kinetic" / ".local-venvs").exists()
