"""The package as a user installs it: a wheel built from this checkout, installed into
a clean venv with the ``[gke]`` extra (found by ``airflow providers get``) and without
any extra (the README's local-backend install: every public name imports and a local
DAG runs end to end, with neither the Kubernetes client nor providers-google there).

The venvs' packages come from the lock (as constraints), which uv links from its
cache, so these tests need no more of the package index than the test command did.
The locks themselves are checked against the command in their header.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCKS = ("requirements/lock.txt", "requirements/lock-3.1.txt")
#: What only the [gke] extra brings (the base install must run without them).
GKE_ONLY = ("kubernetes", "kubernetes-asyncio", "apache-airflow-providers-google",
            "apache-airflow-providers-cncf-kubernetes")  # fmt: skip


def _uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built once for the module's tests."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = root / "src"
    shutil.copytree(
        REPO / "airflow_provider_kinetic",
        src / "airflow_provider_kinetic",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    dist = root / "dist"
    # The build backend (setuptools) from this venv: no build-time download.
    _run(
        [*_uv(), "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "--out-dir", str(dist), str(src)],
    )  # fmt: skip
    (built,) = dist.glob("airflow_provider_kinetic-*.whl")
    return built


def _venv(where: Path, requirement: str) -> Path:
    """A clean venv with ``requirement`` installed at the lock's versions; its bin/."""
    _run([*_uv(), "venv", "--quiet", "--python", sys.executable, str(where)])
    find_links = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    extra = [arg for link in find_links for arg in ("--find-links", link)]
    _run(
        [*_uv(), "pip", "install", "--quiet", "--python", str(where / "bin" / "python"),
         *extra, "--constraint", str(REPO / "requirements" / "lock.txt"), requirement],
    )  # fmt: skip
    return where / "bin"


def _user_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """This process's environment without the test session's Airflow and kinetic settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW_", "_AIRFLOW", "KINETIC_"))
    }
    env.update({"AIRFLOW_HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"})
    return env


@pytest.mark.timeout(1200)
def test_wheel_with_gke_extra_in_a_clean_venv_passes_providers_get(tmp_path: Path, wheel):
    venv = tmp_path / "venv"
    bin_dir = _venv(venv, f"{wheel}[gke]")
    env = _user_env(tmp_path / "airflow-home", bin_dir)
    out = _run(
        [str(bin_dir / "airflow"), "providers", "get", "airflow-provider-kinetic",
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
    python = str(bin_dir / "python")
    # The wheel's own files, not this checkout's: the package imports from the venv.
    where = _run(
        [python, "-c", "import airflow_provider_kinetic as k; print(k.__file__)"],
        env=env, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(venv)), where
    # The stat cache's native comparison was compiled into the wheel (setup.py).
    native = _run(
        [python, "-c",
         "from airflow_provider_kinetic.core.data.hashing import fastlstat; "
         "print(fastlstat.available())"],
        env=env, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert native == "True"


BASE_DAG = '''
"""The README's local install: the operator on local Data, then @task.kinetic."""
import datetime
import os

from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticRunOperator


def count_lines(folder):
    import os
    import sys

    names = sorted(os.listdir(folder))
    lines = sum(len(open(os.path.join(folder, n)).read().splitlines()) for n in names)
    return {"files": names, "lines": lines, "python": sys.executable}


with DAG("kinetic_base_install", schedule=None, catchup=False,
         start_date=datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)) as dag:
    counted = KineticRunOperator(task_id="count", python_callable=count_lines,
                                 op_args=[Data(os.environ["BASE_INSTALL_DATA"])],
                                 requirements=[])

    @task.kinetic(accelerator="cpu", requirements=[])
    def double(result):
        return result["lines"] * 2

    double(counted.output)
'''

BASE_RUN = """
import importlib.metadata, json, sys
import airflow_provider_kinetic as kinetic
public = {name: getattr(kinetic, name) for name in kinetic.__all__}
from airflow_provider_kinetic.core.backends.registry import backend_class
try:
    backend_class("gke")
    gke_error = None
except ImportError as exc:
    gke_error = str(exc)
sys.path.insert(0, sys.argv[1])
import datetime
from base_install_dag import dag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dr = dag.test(logical_date=datetime.datetime(2026, 11, 20, tzinfo=datetime.timezone.utc))
with create_session() as session:
    rows = session.query(XComModel).filter(
        XComModel.dag_id == dr.dag_id, XComModel.run_id == dr.run_id)
    xcoms = {f"{r.task_id}.{r.key}": XComModel.deserialize_value(r) for r in rows}
print(json.dumps({
    "file": kinetic.__file__, "public": sorted(public), "all": sorted(kinetic.__all__),
    "dists": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
    "gke_error": gke_error, "state": str(dr.state), "xcoms": xcoms,
}, default=str))
"""


@pytest.mark.timeout(1200)
def test_base_install_without_extras_runs_a_local_dag(tmp_path: Path, wheel):
    """``pip install airflow-provider-kinetic`` (no extra): every public name imports
    and a DAG runs on the local backend, the job in this venv's Python."""
    venv = tmp_path / "venv"
    bin_dir = _venv(venv, str(wheel))
    home = tmp_path / "airflow-home"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "base_install_dag.py").write_text(BASE_DAG)
    data = tmp_path / "data"
    data.mkdir()
    (data / "lines.txt").write_text("a\nb\nc\n")
    env = _user_env(home, bin_dir)
    env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "BASE_INSTALL_DATA": str(data),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})  # fmt: skip
    _run([str(bin_dir / "airflow"), "db", "migrate"], env=env, cwd=tmp_path)
    done = _run([str(bin_dir / "python"), "-c", BASE_RUN, str(dags)], env=env, cwd=tmp_path)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(venv)), out["file"]
    assert not set(GKE_ONLY) & set(out["dists"]), sorted(set(GKE_ONLY) & set(out["dists"]))
    assert "airflow-provider-kinetic" in out["dists"]
    assert out["public"] == out["all"] and "KineticHook" in out["public"]
    # A cluster backend says which extra it needs instead of a bare ModuleNotFoundError.
    assert "airflow-provider-kinetic[gke]" in out["gke_error"], out["gke_error"]
    assert out["state"] == "success", done.stderr[-3000:]
    x = out["xcoms"]
    assert x["count.return_value"] == {
        "files": ["lines.txt"],
        "lines": 3,
        "python": str(bin_dir / "python"),
    }
    assert x["double.return_value"] == 6
    assert x["count.kinetic_job"]["backend"] == "local"
    assert x["count.output_dir"].startswith(f"file://{home}/kinetic/outputs/")


def _header_command(lock: Path) -> list[str]:
    line = lock.read_text().splitlines()[1]
    assert line.startswith("#    uv pip compile "), line
    return shlex.split(line[len("#    uv ") :])


@pytest.mark.parametrize("lock", LOCKS)
def test_each_lock_is_what_its_header_command_makes_from_the_package_index(
    tmp_path: Path, lock: str
):
    """The locks pin torch by PyPI's version (PEP 440 lets ``torch==X`` take the CPU
    build ``X+cpu`` that bootstrap.sh installs) and hold none of the CUDA runtime that
    PyPI's Linux build needs, and re-running the command in their header (against the
    package index alone, the lock as preferences) gives the same lock."""
    path = REPO / lock
    text = path.read_text()
    pins = dict(line.split("==", 1) for line in text.splitlines() if line and line[0].isalnum())
    assert "+" not in pins["torch"] and pins["torch"].startswith("2."), pins["torch"]
    assert not [name for name in pins if name.startswith(("nvidia-", "cuda-", "triton"))]
    cmd = _header_command(path)
    assert "--override" in cmd and "--find-links" not in cmd and "--torch-backend" not in cmd
    out = tmp_path / path.name
    shutil.copy(path, out)  # uv keeps an existing output's pins where they still resolve
    cmd[cmd.index("-o") + 1] = str(out)
    _run([*_uv(), *cmd, "--quiet"], cwd=REPO)
    assert out.read_text().splitlines()[2:] == text.splitlines()[2:]
