"""Wire compatibility with kinetic 0.0.4 itself (the real keras-kinetic wheel).

kinetic's own pod runner (``kinetic/runner/remote_runner.py``, what kinetic images
run) executes a job this provider submitted, against the real fake-gcs-server; our
handle dict carries every field kinetic's ``JobHandle`` requires.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.payload import RemoteFunctionError
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import (
    GROUP_FIELDS,
    HANDLE_FIELDS,
    JobHandle,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.storage import GcsStore
from tests.fixtures import records

spec = importlib.util.find_spec("kinetic")
KINETIC = Path(spec.submodule_search_locations[0]) if spec else None
pytestmark = pytest.mark.skipif(
    KINETIC is None, reason="keras-kinetic==0.0.4 not installed (scripts/test.sh installs it)"
)


class Recording(GkeBackend):
    """Creates nothing: keeps the specs so a test can run them by hand."""

    def __init__(self) -> None:  # no cluster: nothing here talks to one
        self.specs: list[Any] = []

    def submit(self, spec: Any) -> None:
        self.specs.append(spec)

    def status(self, handle: dict) -> StatusReport:
        raise AssertionError("unused")

    def read_logs(self, handle: dict, offset: int = 0) -> tuple[str, int]:
        return "", offset

    def cancel(self, handle: dict) -> None:
        pass


def count_files(path: str, scale: int) -> int:
    import os

    return scale * len(os.listdir(path))


class TwoArgError(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")


def raise_two_arg(n: int) -> None:
    raise TwoArgError(f"E{n}", "the disk is on fire")


def kinetic_runner(
    args: list[str], tmp: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """kinetic's runner keeps its work dir: give it the test's own temp dir."""
    env = {**os.environ, "GOOGLE_CLOUD_PROJECT": "test", "TMPDIR": str(tmp), **(extra_env or {})}
    return subprocess.run(
        [sys.executable, str(KINETIC / "runner" / "remote_runner.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_handle_has_every_kinetic_jobhandle_field():
    tree = ast.parse((KINETIC / "jobs.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JobHandle")
    fields = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)]
    required = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and s.value is None]
    assert tuple(required) == HANDLE_FIELDS
    assert set(fields) - set(required) == set(GROUP_FIELDS) | {"debug"}


def kinetic_jobhandle_class() -> type:
    """kinetic 0.0.4's own ``JobHandle`` (fields, ``from_dict``, ``to_dict``), built from
    its source: importing ``kinetic.jobs`` would need its cloud SDKs."""
    tree = ast.parse((KINETIC / "jobs.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JobHandle")
    keep = [
        n
        for n in cls.body
        if isinstance(n, ast.AnnAssign)
        or (isinstance(n, ast.FunctionDef) and n.name in ("from_dict", "to_dict"))
    ]
    cls.body, cls.decorator_list = keep, [ast.Name("dataclass", ast.Load())]
    module = ast.Module(body=[cls], type_ignores=[])
    namespace: dict[str, Any] = {"dataclass": dataclass, "fields": fields, "Any": Any}
    exec(compile(ast.fix_missing_locations(module), "kinetic/jobs.py", "exec"), namespace)
    return namespace["JobHandle"]


def test_kinetic_reads_our_handle_and_we_read_kinetics():
    theirs = kinetic_jobhandle_class()
    ours = records.handle(
        "job-0000abcd", "bucket", "gke", group_id="grp-1", group_kind="map", group_index=2,
        output_dir="gs://bucket/outputs/x/",
    )  # fmt: skip
    loaded = theirs.from_dict(json.loads(ours.to_json()))
    assert (loaded.job_id, loaded.k8s_name, loaded.group_index) == (
        "job-0000abcd",
        ours.k8s_name,
        2,
    )
    assert JobHandle.from_dict(loaded.to_dict()) == ours.evolve(output_dir=None)


def test_kinetic_runner_executes_our_job(fake_gcs, gcs_bucket, tmp_path):
    (tmp_path / "d").mkdir()
    for i in range(3):
        (tmp_path / "d" / f"f{i}").write_text(str(i))
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    backend = Recording()
    config = KineticConfig(
        backend="gke", bucket=gcs_bucket, project="p", zone="z", cluster="c",
        data_layout="kinetic",  # kinetic's runner reads per-tree entries only
    )  # fmt: skip
    store.data_layout = config.data_layout
    handle, spec = submit_job(
        JobRequest(func=count_files, args=(Data(str(tmp_path / "d")),), kwargs={"scale": 7}),
        config,
        backend,
        store,
    )
    assert handle.k8s_name == f"kinetic-{handle.job_id}"
    # Submitted for kinetic's own runner (no signing secret): its result is unsigned,
    # and the handle says so; jobs for our runner always sign.
    assert handle.result_auth == "none" and not spec.secrets
    assert spec.command == ["python3", "-u", "/app/remote_runner.py"]
    proc = kinetic_runner(spec.args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = cloudpickle.loads(store.read_bytes(f"{handle.job_id}/result.pkl"))
    assert result["success"] is True and result["result"] == 21


def test_kinetic_runner_ignores_debug_mode(fake_gcs, gcs_bucket, tmp_path):
    """A debug job's env (port, wait, breakpoint hook) run by kinetic's runner: it runs
    the function at once (kinetic switches its own debug mode on with KINETIC_DEBUG=1);
    ours would wait 1 s for a debugger and fail."""
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "f").write_text("x")
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    config = KineticConfig(backend="gke", bucket=gcs_bucket, project="p", zone="z", cluster="c")
    request = JobRequest(func=count_files, args=(str(tmp_path / "one"),), kwargs={"scale": 2},
                         options=JobOptions(debug_port=5678, debug_wait_s=1))  # fmt: skip
    handle, spec = submit_job(request, config, Recording(), store)
    debug_env = {k: v for k, v in spec.env.items() if "DEBUG" in k or k == "PYTHONBREAKPOINT"}
    assert set(debug_env) >= {"KINETIC_DEBUG_PORT", "KINETIC_DEBUG_WAIT_S", "PYTHONBREAKPOINT"}
    assert handle.debug and kinetic_jobhandle_class().from_dict(handle.to_dict()).debug
    proc = kinetic_runner(spec.args, tmp_path, debug_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "debugpy" not in proc.stderr.lower()
    result = cloudpickle.loads(store.read_bytes(f"{handle.job_id}/result.pkl"))
    assert result["success"] is True and result["result"] == 2


def test_kinetic_runner_refuses_a_batch_child_loudly(fake_gcs, gcs_bucket, tmp_path):
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    config = KineticConfig(backend="gke", bucket=gcs_bucket, project="p", zone="z", cluster="c")
    state, objects, local = plan_batch(
        JobRequest(func=count_files, output_dir=store.uri("outputs/x")),
        ["/tmp"],
        "single",
        store,
        config=config,
        max_concurrent=1,
        retries=0,
        fail_fast=False,
    )
    batchlaunch.start_batch(state, objects, local, store)
    backend = Recording()
    batchlaunch.launch(state, config, backend, store)
    child = backend.specs[0]
    proc = kinetic_runner(child.args, tmp_path)
    assert proc.returncode != 0
    result = cloudpickle.loads(store.read_bytes(f"{child.job_id}/result.pkl"))
    assert result["success"] is False
    assert "needs the airflow-provider-kinetic runner" in str(result["exception"])


def test_we_read_kinetics_failure_whose_exception_cannot_be_rebuilt(fake_gcs, gcs_bucket, tmp_path):
    """kinetic's runner records the exception object and traceback only: the client
    names the class and message from the pickle itself, and keeps the traceback."""
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    config = KineticConfig(backend="gke", bucket=gcs_bucket, project="p", zone="z", cluster="c")
    handle, spec = submit_job(JobRequest(func=raise_two_arg, args=(3,)), config, Recording(), store)
    proc = kinetic_runner(spec.args, tmp_path)
    assert proc.returncode != 0
    with pytest.raises(RemoteFunctionError) as info:
        collect(store, handle.job_id, JobStatus.FAILED)
    name = f"{__name__}.TwoArgError"
    assert str(info.value) == f"{name}: E3: the disk is on fire"
    tb = next(n for n in info.value.__notes__ if n.startswith("Remote traceback:"))
    assert "in raise_two_arg" in tb and tb.rstrip().endswith("TwoArgError: E3: the disk is on fire")


def file_digests(path: str) -> dict[str, str]:
    import hashlib
    import os

    out = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, name), path)] = hashlib.sha256(
                    f.read()
                ).hexdigest()
    return out


def test_kinetic_runner_reads_our_composite_upload(fake_gcs, gcs_bucket, tmp_path):
    """A big file we upload as composed parts is exactly what kinetic's runner expects:
    its own download gives the function the same bytes, and no part is left."""
    src = tmp_path / "d"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(3 << 20))
    (src / "small.txt").write_text("small")
    store = GcsStore(gcs_bucket, client=fake_gcs.client(), chunked_min_bytes=1 << 20)
    store.data_layout = "kinetic"  # kinetic's runner reads per-tree entries only
    config = KineticConfig(backend="gke", bucket=gcs_bucket, project="p", zone="z", cluster="c")
    handle, spec = submit_job(
        JobRequest(func=file_digests, args=(Data(str(src)),)), config, Recording(), store
    )
    proc = kinetic_runner(spec.args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = cloudpickle.loads(store.read_bytes(f"{handle.job_id}/result.pkl"))
    assert result["success"] is True and result["result"] == file_digests(str(src))
    assert not store.list(".kinetic-parts/")


_KINETIC_UPLOAD = """
import sys, types
package = types.ModuleType("kinetic")  # kinetic/__init__ needs SDKs this env lacks
package.__path__ = [sys.argv[1]]
sys.modules["kinetic"] = package
from kinetic.data import data
from kinetic.utils import storage
print(storage.upload_data(sys.argv[2], data.Data(sys.argv[3]), project="test"))
"""


def test_our_runner_download_verifies_what_kinetic_uploads(fake_gcs, gcs_bucket, tmp_path):
    """kinetic's own client uploads a Data (empty marker, its layout); our runner's
    download takes it, content hash checked, files identical."""
    from airflow_provider_kinetic.core.data.refs import make_data_ref
    from airflow_provider_kinetic.core.data.schemes.download import download_from_store

    src = tmp_path / "d"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.bin").write_bytes(os.urandom(70_000))
    (src / "b.txt").write_text("b")
    proc = subprocess.run(
        [sys.executable, "-c", _KINETIC_UPLOAD, str(KINETIC), gcs_bucket, str(src)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GOOGLE_CLOUD_PROJECT": "test"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    uri = proc.stdout.strip().splitlines()[-1]
    assert uri.endswith(Data(str(src)).content_hash())
    out = download_from_store(make_data_ref(uri, True), str(tmp_path / "out"))
    assert file_digests(out) == file_digests(str(src))
