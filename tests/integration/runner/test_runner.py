"""The pod runner end to end, as a real ``python -m airflow_provider_kinetic.runner``
subprocess with kinetic's flags, against a ``file://`` store and fake-gcs-server.

Artifacts are staged with the same core functions ``submit_job`` uses (``prepare``,
the data cache, ``store.write_bytes``), so what the runner reads is what a client
really writes.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple

import cloudpickle
import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.jobs import results
from airflow_provider_kinetic.core.jobs.pack import prepare
from airflow_provider_kinetic.core.jobs.progress import read_progress
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.spec.handles import artifact_key, new_job_id
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore

REPO_ROOT = Path(__file__).resolve().parents[3]
RUNNER_TIMEOUT_S = 120


def stage(store: ObjectStore, request: JobRequest, env_vars: dict[str, str] | None = None) -> list:
    """Upload data, payload and context as ``submit_job`` does; return the runner flags."""
    job_id = request.job_id or new_job_id()
    request.job_id = job_id
    env = {"KINETIC_OUTPUT_DIR": "/tmp/kinetic-test-outputs", **(env_vars or {})}
    packed = prepare(request, store, env)
    datacache.upload_all(store, packed.local_data)
    store.write_bytes(artifact_key(job_id, "payload.pkl"), packed.payload)
    store.write_bytes(artifact_key(job_id, "context.zip"), packed.context)
    return [
        "--context-gcs",
        store.uri(artifact_key(job_id, "context.zip")),
        "--payload-gcs",
        store.uri(artifact_key(job_id, "payload.pkl")),
        "--result-gcs",
        store.uri(artifact_key(job_id, "result.pkl")),
        "--payload-sha256",
        hashlib.sha256(packed.payload).hexdigest(),
        "--context-sha256",
        hashlib.sha256(packed.context).hexdigest(),
    ]


def run_runner(
    flags: list[str],
    extra_env: dict[str, str] | None = None,
    python: str = sys.executable,
    base_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ if base_env is None else base_env)
    for var in ("TPU_WORKER_ID", "LWS_WORKER_INDEX"):
        env.pop(var, None)
    env["PYTHONPATH"] = str(REPO_ROOT)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
    env.update(extra_env or {})
    return subprocess.run(
        [python, "-m", "airflow_provider_kinetic.runner", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUNNER_TIMEOUT_S,
    )


def read_result(store: ObjectStore, job_id: str, name: str = "result.pkl") -> dict[str, Any]:
    return cloudpickle.loads(store.read_bytes(artifact_key(job_id, name)))


# ---- functions the jobs run (pickled by value with this module) -------------------


def add(a, b):
    return {"sum": a + b, "pid": os.getpid()}


def explode_remotely(x):
    raise ValueError(f"bad value {x}")


def write_marker(path):
    Path(path).write_text("executed")
    return "ran"


def exit_with(code):
    sys.exit(code)


def inspect_data(tree, single, mount):
    with open(single) as f:
        single_text = f.read()
    return {
        "tree": tree,
        "tree_files": sorted(
            os.path.relpath(os.path.join(d, n), tree) for d, _, fs in os.walk(tree) for n in fs
        ),
        "single": single,
        "single_text": single_text,
        "mount_files": sorted(os.listdir(mount)),
        "mount_text": Path(mount, "sub", "v.txt").read_text(),
        "output_dir": os.environ.get("KINETIC_OUTPUT_DIR"),
        "captured": os.environ.get("KINETIC_TEST_CAPTURED"),
    }


class Pair(NamedTuple):
    path: object
    n: int


def inspect_containers(cfg, untouched, pair, listing):
    return {
        "cfg_type": type(cfg).__name__,
        "factory": cfg.default_factory,
        "cfg_files": sorted(os.listdir(cfg["path"])),
        "missing": cfg["nope"],
        "untouched": (type(untouched).__name__, dict(untouched)),
        "pair": (type(pair).__name__, sorted(os.listdir(pair.path)), pair.n),
        "listing": [os.path.isdir(p) for p in listing],
    }


# ---- tests ---------------------------------------------------------------------------


def test_success(store: ObjectStore) -> None:
    flags = stage(store, JobRequest(func=add, args=(2,), kwargs={"b": 40}))
    proc = run_runner(flags)
    assert proc.returncode == 0, proc.stderr
    job_id = flags[1].rsplit("/", 2)[-2]
    result = read_result(store, job_id)
    assert result["success"] is True
    assert result["result"]["sum"] == 42 and result["result"]["pid"] != os.getpid()
    assert result["phase"] == "execute" and result["host_index"] == 0
    assert result["exception"] is None and result["traceback"] is None


def test_raising_function(store: ObjectStore) -> None:
    request = JobRequest(func=explode_remotely, args=(7,))
    flags = stage(store, request)
    proc = run_runner(flags)
    assert proc.returncode == 1
    result = read_result(store, request.job_id)
    assert result["success"] is False and result["phase"] == "execute"
    assert type(result["exception"]) is ValueError
    assert str(result["exception"]) == "bad value 7"
    assert "explode_remotely" in result["traceback"]
    assert "ValueError: bad value 7" in result["traceback"]
    assert "explode_remotely" in proc.stderr  # the traceback also reaches the pod log


class TwoArgError(Exception):
    """Pickles as ``TwoArgError(message)``: it cannot be rebuilt from its pickle."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code


class HoldsALock(Exception):
    """Cannot be pickled at all (its state holds a lock)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()


def raise_two_arg(n):
    raise TwoArgError(f"E{n}", "the disk is on fire")


def raise_holding_a_lock(n):
    raise HoldsALock(f"locked {n}")


@pytest.mark.parametrize(
    ("func", "name", "message", "picklable"),
    [
        (raise_two_arg, "TwoArgError", "E5: the disk is on fire", True),
        (raise_holding_a_lock, "HoldsALock", "locked 5", False),
    ],
)
def test_failure_records_type_message_and_traceback_as_strings(
    store: ObjectStore, func, name, message, picklable
) -> None:
    """kinetic's keys stay as they were; the exception's type name and message ride
    beside them as plain strings, so a client that cannot rebuild it still can say
    what was raised (read here without unpickling any user class)."""
    request = JobRequest(func=func, args=(5,))
    assert run_runner(stage(store, request)).returncode == 1
    blob = store.read_bytes(artifact_key(request.job_id, "result.pkl"))
    if picklable:
        with pytest.raises(TypeError, match="missing 1 required positional argument"):
            cloudpickle.loads(blob)  # what reading it did before the strings were there
        result = results.read_result(store, request.job_id, (0,))
        assert result is not None
    else:  # kinetic's fallback shape: a RuntimeError naming the serialisation failure
        result = cloudpickle.loads(blob)
        assert isinstance(result["exception"], RuntimeError)
        assert "Result serialization failed" in str(result["exception"])
    assert result["success"] is False
    assert result["exception_type"] == f"{__name__}.{name}"
    assert result["exception_message"] == message
    assert f"in {func.__name__}" in result["traceback"]
    assert result["traceback"].rstrip().endswith(f"{__name__}.{name}: {message}")


@pytest.mark.parametrize("which", ["--payload-sha256", "--context-sha256"])
def test_sha256_mismatch_executes_nothing(store: ObjectStore, tmp_path: Path, which) -> None:
    marker = tmp_path / "executed.txt"
    request = JobRequest(func=write_marker, args=(str(marker),))
    flags = stage(store, request)
    flags[flags.index(which) + 1] = "0" * 64
    proc = run_runner(flags)
    assert proc.returncode == 1
    assert not marker.exists()
    result = read_result(store, request.job_id)
    assert result["success"] is False
    assert result["phase"] == "artifact verification"
    assert "SHA-256 mismatch" in str(result["exception"])
    # Sanity: the correct hashes run the same payload.
    assert (
        run_runner(stage(store, JobRequest(func=write_marker, args=(str(marker),)))).returncode == 0
    )
    assert marker.read_text() == "executed"


@pytest.mark.parametrize("code, ok", [(0, True), (None, True), (3, False)])
def test_sys_exit(store: ObjectStore, code, ok) -> None:
    request = JobRequest(func=exit_with, args=(code,))
    proc = run_runner(stage(store, request))
    result = read_result(store, request.job_id)
    assert result["success"] is ok
    assert proc.returncode == (0 if ok else 1)
    if ok:
        assert result["result"] is None
    else:
        assert isinstance(result["exception"], RuntimeError)
        assert "sys.exit(3)" in str(result["exception"])


def test_data_refs_volumes_and_output_dir(store: ObjectStore, tmp_path: Path, monkeypatch) -> None:
    tree = tmp_path / "tree"
    (tree / "nested").mkdir(parents=True)
    (tree / "a.txt").write_text("A")
    (tree / "nested" / "b.txt").write_text("B")
    single = tmp_path / "weights.bin"
    single.write_text("single file")
    vol = tmp_path / "vol"
    (vol / "sub").mkdir(parents=True)
    (vol / "sub" / "v.txt").write_text("volume")
    mount = str(tmp_path / "mnt" / "dataset")  # absolute, outside the runner's workdir
    monkeypatch.setenv("KINETIC_TEST_CAPTURED", "yes")
    request = JobRequest(
        func=inspect_data,
        args=(Data(str(tree)), Data(str(single))),
        kwargs={"mount": mount},
        volumes={mount: Data(str(vol))},
        capture_env_vars=["KINETIC_TEST_*"],
    )
    from airflow_provider_kinetic.core.jobs.request import capture_env

    flags = stage(store, request, capture_env(request.capture_env_vars))
    proc = run_runner(flags, {"KINETIC_TEST_CAPTURED": ""})
    assert proc.returncode == 0, proc.stderr
    out = read_result(store, request.job_id)["result"]
    assert out["tree"] != str(tree) and os.path.isabs(out["tree"])
    assert out["tree_files"] == ["a.txt", os.path.join("nested", "b.txt")]
    assert out["single"] != str(single) and os.path.basename(out["single"]) == "weights.bin"
    assert out["single_text"] == "single file"
    assert out["mount_files"] == ["sub"] and out["mount_text"] == "volume"
    assert os.path.isfile(os.path.join(mount, "sub", "v.txt"))  # materialised at the mount
    assert out["output_dir"] == "/tmp/kinetic-test-outputs"
    assert out["captured"] == "yes"  # payload env_vars override the pod's env


def test_data_inside_subclassed_containers(store: ObjectStore, tmp_path: Path) -> None:
    """defaultdict/NamedTuple/list arguments survive the client and the runner walk."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f.txt").write_text("f")
    d = Data(str(tree))
    request = JobRequest(
        func=inspect_containers,
        args=(
            collections.defaultdict(list, {"path": d}),
            collections.defaultdict(int, {"k": 1}),  # no Data inside
            Pair(d, 3),
            [d, d],
        ),
    )
    proc = run_runner(stage(store, request))
    assert proc.returncode == 0, proc.stderr
    out = read_result(store, request.job_id)["result"]
    assert out["cfg_type"] == "defaultdict" and out["factory"] is list
    assert out["cfg_files"] == ["f.txt"] and out["missing"] == []
    assert out["untouched"] == ("defaultdict", {"k": 1})
    assert out["pair"] == ("Pair", ["f.txt"], 3)
    assert out["listing"] == [True, True]


def test_worker_failure_writes_worker_result(store: ObjectStore) -> None:
    request = JobRequest(func=explode_remotely, args=(1,))
    proc = run_runner(stage(store, request), {"TPU_WORKER_ID": "1"})
    assert proc.returncode == 1
    assert not store.exists(artifact_key(request.job_id, "result.pkl"))
    result = read_result(store, request.job_id, "result-worker-1.pkl")
    assert result["success"] is False and result["host_index"] == 1
    assert str(result["exception"]) == "bad value 1"


def test_a_host_of_slice_1_fails_as_its_job_wide_host_with_the_slice_layout(
    store: ObjectStore,
) -> None:
    """A multi-slice job (JobSet env): slice 1 host 0 of 2 x 2 is job-wide host 2, and
    its failure payload says the layout, so the task's failure names slice 1; a user
    error exits USER_ERROR_EXIT (the JobSet's rule then fails the whole gang)."""
    request = JobRequest(func=explode_remotely, args=(2,))
    env = {"TPU_WORKER_ID": "0", "MEGASCALE_SLICE_ID": "1", "MEGASCALE_NUM_SLICES": "2",
           "KINETIC_SLICE_HOSTS": "2"}  # fmt: skip
    proc = run_runner(stage(store, request), env)
    assert proc.returncode == 86  # USER_ERROR_EXIT: the JobSet fails the gang, no restart
    result = read_result(store, request.job_id, "result-worker-2.pkl")
    assert (result["host_index"], result["num_slices"], result["slice_hosts"]) == (2, 2, 2)
    assert str(result["exception"]) == "bad value 2"


def test_worker_success_writes_nothing(store: ObjectStore) -> None:
    request = JobRequest(func=add, args=(1, 2))
    flags = stage(store, request)
    before = store.list(f"{request.job_id}/")
    proc = run_runner(flags, {"TPU_WORKER_ID": "1"})
    assert proc.returncode == 0, proc.stderr
    assert store.list(f"{request.job_id}/") == before
    assert sorted(k.rsplit("/", 1)[1] for k in before) == ["context.zip", "payload.pkl"]


def test_missing_flags_exit_nonzero() -> None:
    proc = run_runner(["--payload-gcs", "file:///nope"])
    assert proc.returncode != 0
    assert "--context-gcs" in proc.stderr and "--result-gcs" in proc.stderr


# ---- a bare interpreter: only our package, cloudpickle and google-cloud-storage -----


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh venv (same Python) with only cloudpickle + google-cloud-storage."""
    venv = tmp_path_factory.mktemp("bare-venv") / "venv"
    pins = [
        f"cloudpickle=={importlib.metadata.version('cloudpickle')}",
        f"google-cloud-storage=={importlib.metadata.version('google-cloud-storage')}",
    ]
    py = venv / "bin" / "python"

    def uv(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["uv", *args], capture_output=True, text=True, timeout=300)
        except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"uv unavailable: {exc}")

    made = uv("venv", "--python", sys.executable, str(venv))
    if made.returncode != 0:
        pytest.skip(f"uv venv failed: {made.stderr.strip()[-500:]}")
    offline = uv("pip", "install", "--offline", "--python", str(py), *pins)
    if offline.returncode != 0:
        online = uv("pip", "install", "--python", str(py), *pins)
        if online.returncode != 0:
            pytest.skip(
                "cannot install cloudpickle + google-cloud-storage into a fresh venv: "
                f"offline: {offline.stderr.strip()[-300:]}; online: {online.stderr.strip()[-300:]}"
            )
    return str(py)


def test_runner_in_bare_venv(bare_python: str, tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    probe = subprocess.run(
        [bare_python, "-c", "import airflow"],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode != 0 and "No module named 'airflow'" in probe.stderr
    store = LocalStore(str(tmp_path / "bucket"))
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    (data_dir / "x.txt").write_text("x")
    request = JobRequest(func=inspect_args_bare, args=(Data(str(data_dir)),))
    proc = run_runner(stage(store, request), python=bare_python, base_env=env)
    assert proc.returncode == 0, proc.stderr
    result = read_result(store, request.job_id)
    assert result["success"] is True, result
    listing, airflow_loaded, executable = result["result"]
    assert listing == ["x.txt"] and airflow_loaded is False
    assert executable == bare_python
    # progress.update works there too; its last update, throttled, is written at exit
    last = read_progress(store, request.job_id)
    assert last is not None and (last.step, last.total, last.message) == (3, 3, "done")


def inspect_args_bare(path):
    from airflow_provider_kinetic import progress

    for step in (1, 2, 3):  # within the default 5 s: only the first is written now
        progress.update(step, total=3, message="done" if step == 3 else None)
    return sorted(os.listdir(path)), "airflow" in sys.modules, sys.executable


def reports(steps):
    from airflow_provider_kinetic import progress

    for step in range(1, steps + 1):
        progress.update(step, total=steps, metrics={"loss": 1 / step})
    return steps


@pytest.mark.parametrize("host", [0, 1])
def test_progress_lands_in_the_job_dir_and_a_worker_host_writes_none(
    store: ObjectStore, host: int
) -> None:
    request = JobRequest(func=reports, args=(50,))
    proc = run_runner(stage(store, request), extra_env={"TPU_WORKER_ID": str(host)})
    assert proc.returncode == 0, proc.stderr
    last = read_progress(store, request.job_id)
    if host == 0:  # 50 updates in well under the 5 s throttle: the last, written at exit
        assert (last.step, last.total, last.metrics) == (50, 50, {"loss": 0.02})
        assert last.first_step == 1
    else:
        assert last is None  # host 1's updates are dropped: the leader's are the job's
    assert "outside a kinetic job" not in proc.stderr
