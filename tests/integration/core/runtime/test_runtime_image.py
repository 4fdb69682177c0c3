"""The runner image's Python environment, built from ``docker/Dockerfile.cpu``'s own
install lines, runs a job (no Docker daemon, no network).

The Dockerfile's ``RUN uv pip install ...`` lines are executed with ``uv pip install
--python <venv> --no-index --find-links .artifacts/wheelhouse --no-cache`` at
``requirements/lock.txt``'s versions: the wheelhouse is built by the test command
(``scripts/wheelhouse.py``, from the package index), never read from the machine's uv
cache, whose contents once decided whether this passed; without it the test fails and
says how to build it.  The ``COPY`` sources come from the same generator that writes
the build context (``write_prebuilt_context``).  Then the real runner runs in that
venv, through the image's ``/app/remote_runner.py`` shim, against a ``file://``
store: it must work with Airflow absent.  A second job goes the prebuilt way: its
requirements (a wheel this test builds) are installed by the runner at start from
``--requirements-gcs``.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import cloudpickle
import pytest

from airflow_provider_kinetic.core.jobs.pack import prepare
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.runtime.buildfiles import write_prebuilt_context
from airflow_provider_kinetic.core.runtime.images import PUBLISHED_PYTHON
from airflow_provider_kinetic.core.spec.handles import artifact_key, new_job_id
from airflow_provider_kinetic.core.storage import LocalStore

REPO = Path(__file__).resolve().parents[4]
UV = shutil.which("uv")
pytestmark = pytest.mark.skipif(
    UV is None, reason="uv is not on PATH (scripts/bootstrap.sh installs it)"
)


def dockerfile_steps(text: str) -> tuple[dict[str, str], list[list[str]]]:
    """(COPY destination -> context source, argv of each ``RUN uv pip install``)."""
    copies, installs = {}, []
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            src, dest = line.split()[1:3]
            copies[dest.rstrip("/")] = src.rstrip("/")
        elif line.startswith("RUN uv pip install"):
            installs.append(shlex.split(line[len("RUN ") :]))
    return copies, installs


def localise(argv: list[str], copies: dict[str, str], ctx: Path, python: str) -> list[str]:
    """An image install line as an offline install into ``python``'s venv."""
    out = []
    for arg in argv:
        for dest, src in copies.items():
            if arg.startswith(dest + "/"):
                arg = str(ctx / src) + arg[len(dest) :]
        if arg == "--system":
            out += ["--python", python]
        elif "*" in arg:
            out += sorted(glob.glob(arg)) or [arg]
        else:
            out.append(arg)
    return out


def wheelhouse() -> str:
    """The test command's wheelhouse (``scripts/wheelhouse.py``); fails, not skips,
    with how to build it when it is missing or not built for this lock."""
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "wheelhouse.py"), "--check"],
                           capture_output=True, text=True)  # fmt: skip
    if check.returncode != 0:
        pytest.fail(check.stderr.strip() or check.stdout, pytrace=False)
    return check.stdout.strip()


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PUBLISHED_PYTHON:
        pytest.skip(f"the published images are Python {PUBLISHED_PYTHON}")
    root = tmp_path_factory.mktemp("image")
    ctx = root / "ctx"
    write_prebuilt_context(str(ctx))
    text = (REPO / "docker" / "Dockerfile.cpu").read_text()
    assert text == (ctx / "Dockerfile.cpu").read_text()
    copies, installs = dockerfile_steps(text)
    assert len(installs) == 2 and "--no-deps" in installs[1]
    wheels = wheelhouse()
    subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, str(root / "venv")],
                   check=True)  # fmt: skip
    python = str(root / "venv" / "bin" / "python")
    (root / "uv-cache").mkdir()  # empty: what a machine's cache holds must not matter
    env = {**os.environ, "UV_CACHE_DIR": str(root / "uv-cache")}
    for argv in installs:
        cmd = localise(argv, copies, ctx, python)
        cmd += ["--no-index", "--find-links", wheels, "--no-cache", "--offline", "--quiet",
                "--constraint", str(REPO / "requirements" / "lock.txt")]  # fmt: skip
        proc = subprocess.run([UV, *cmd[1:]], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr}"
    shutil.copy(ctx / "remote_runner.py", root / "remote_runner.py")
    return python


def probe() -> dict:
    import importlib.util
    import sys

    extra = importlib.util.find_spec("kinetic_probe_pkg")
    return {
        "prefix": sys.prefix,
        "airflow": importlib.util.find_spec("airflow") is not None,
        "jax": importlib.util.find_spec("jax") is not None,
        "probe": __import__("kinetic_probe_pkg").VALUE if extra else None,
    }


def stage(store: LocalStore, requirements: str | None = None) -> tuple[str, list[str]]:
    job_id = new_job_id()
    request = JobRequest(func=probe, by_value_roots=[str(REPO / "tests")])
    packed = prepare(request, store, {"KINETIC_OUTPUT_DIR": str(Path(store.bucket) / "out")})
    store.write_bytes(artifact_key(job_id, "payload.pkl"), packed.payload)
    store.write_bytes(artifact_key(job_id, "context.zip"), packed.context)
    flags = [
        "--context-gcs", store.uri(artifact_key(job_id, "context.zip")),
        "--payload-gcs", store.uri(artifact_key(job_id, "payload.pkl")),
        "--result-gcs", store.uri(artifact_key(job_id, "result.pkl")),
    ]  # fmt: skip
    if requirements is not None:
        store.write_bytes(artifact_key(job_id, "requirements.txt"), requirements.encode())
        flags += ["--requirements-gcs", store.uri(artifact_key(job_id, "requirements.txt"))]
    flags += ["--payload-sha256", hashlib.sha256(packed.payload).hexdigest()]
    return job_id, flags


def run_in_image(python: str, flags: list[str], cwd: Path, env: dict[str, str] | None = None):
    """``python3 -u /app/remote_runner.py`` as the image runs it: no repo on the path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    base["PATH"] = f"{Path(python).parent}{os.pathsep}{base.get('PATH', '')}"
    shim = Path(python).parents[2] / "remote_runner.py"
    return subprocess.run([python, "-u", str(shim), *flags], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**base, **(env or {})})  # fmt: skip


def tiny_wheel(folder: Path) -> None:
    """``kinetic_probe_pkg==1.0``: a one-module wheel for the offline install."""
    info = "kinetic_probe_pkg-1.0.dist-info"
    files = {
        "kinetic_probe_pkg.py": b"VALUE = 42\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: kinetic-probe-pkg\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(name, data)
    folder.mkdir()
    (folder / "kinetic_probe_pkg-1.0-py3-none-any.whl").write_bytes(buf.getvalue())


def test_runner_runs_in_the_image_environment_without_airflow(image_python, tmp_path):
    store = LocalStore(str(tmp_path / "bucket"))
    job_id, flags = stage(store)
    proc = run_in_image(image_python, flags, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = cloudpickle.loads(store.read_bytes(artifact_key(job_id, "result.pkl")))
    assert result["success"], result
    value = result["result"]
    assert value["prefix"] == str(Path(image_python).parents[1])
    assert value["airflow"] is False and value["jax"] is True and value["probe"] is None


def test_prebuilt_requirements_are_installed_at_start(image_python, tmp_path):
    store = LocalStore(str(tmp_path / "bucket"))
    tiny_wheel(tmp_path / "wheels")
    job_id, flags = stage(store, "kinetic-probe-pkg==1.0\n")
    env = {"UV_OFFLINE": "1", "UV_FIND_LINKS": str(tmp_path / "wheels"),
           "UV_CACHE_DIR": str(tmp_path / "uv-cache")}  # fmt: skip
    try:
        proc = run_in_image(image_python, flags, tmp_path, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = cloudpickle.loads(store.read_bytes(artifact_key(job_id, "result.pkl")))
        assert result["success"], result
        assert result["result"]["probe"] == 42, proc.stdout + proc.stderr
    finally:  # the module-scoped image stays as the Dockerfile made it
        subprocess.run([UV, "pip", "uninstall", "--quiet", "--python", image_python,
                        "kinetic-probe-pkg"], capture_output=True)  # fmt: skip
