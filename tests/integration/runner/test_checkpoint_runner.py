"""The runner's attempts and checkpoints, as a real ``python -m
airflow_provider_kinetic.runner`` process against a ``file://`` store and
fake-gcs-server: the attempt number counts starts, files come back, and what the
function wrote is saved periodically, on SIGTERM (GKE's preemption notice) and at exit
(a failing one too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_provider_kinetic.core.jobs import checkpoint as ck
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.storage import ObjectStore
from tests.fixtures.waiting import wait_for
from tests.integration.runner.test_runner import REPO_ROOT, read_result, run_runner, stage

TASK = {"dag_id": "ckpt", "run_id": "manual__1", "task_id": "train", "map_index": -1}
HOST0 = ck.host_key(ck.checkpoint_key(TASK, "any"), 0)


def bump_step() -> dict[str, Any]:
    """Reads the step its last attempt saved, saves the next one."""
    import os

    folder = os.environ["KINETIC_CHECKPOINT_DIR"]
    path = os.path.join(folder, "state", "step.txt")
    before = None
    if os.path.exists(path):
        with open(path) as f:
            before = f.read()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(str(int(before or 0) + 1))
    return {"attempt": os.environ["KINETIC_ATTEMPT"], "before": before, "dir": folder}


def save_then_wait(marker: str, fail: bool = False) -> None:
    """Saves a checkpoint, says so through ``marker``, then fails or runs until the
    test releases it (``marker.release``) or kills it."""
    import os
    import time

    with open(os.path.join(os.environ["KINETIC_CHECKPOINT_DIR"], "model.bin"), "w") as f:
        f.write("step 7")
    open(marker, "w").close()
    if fail:
        raise RuntimeError("training diverged")
    while not os.path.exists(marker + ".release"):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file


def env_for(store: ObjectStore, tmp_path: Path, **more: str) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {ck.CHECKPOINT_URI_ENV: store.uri(ck.checkpoint_key(TASK, "any")),
            "TMPDIR": str(tmp_path / "tmp"), **more}  # fmt: skip


def manifest_files(store: ObjectStore) -> dict[str, bytes]:
    """{path: content} of the published snapshot ({} before the first)."""
    if not store.exists(HOST0 + ck.MANIFEST_NAME):
        return {}
    files = json.loads(store.read_bytes(HOST0 + ck.MANIFEST_NAME))["files"]
    return {rel: store.read_bytes(HOST0 + e["key"]) for rel, e in files.items()}


def start(flags: list[str], env: dict[str, str]) -> subprocess.Popen:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    for var in ("TPU_WORKER_ID", "LWS_WORKER_INDEX"):
        full.pop(var, None)
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_kinetic.runner", *flags],
        env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_attempts_count_starts_and_the_directory_comes_back(store, tmp_path):
    env = env_for(store, tmp_path)
    seen, jobs = [], []
    for _ in range(3):  # three jobs of one task run: resubmits, retries, clears
        request = JobRequest(func=bump_step)
        before = time.time()
        proc = run_runner(stage(store, request), env)
        assert proc.returncode == 0, proc.stderr
        seen.append(read_result(store, request.job_id)["result"])
        jobs.append((request.job_id, before, time.time()))
    assert [(s["attempt"], s["before"]) for s in seen] == [("1", None), ("2", "1"), ("3", "2")]
    assert all(os.path.isabs(s["dir"]) and "://" not in s["dir"] for s in seen)
    assert manifest_files(store) == {"state/step.txt": b"3"}
    for n, (job_id, before, after) in enumerate(jobs, start=1):
        started = ck.read_started(store, job_id)
        assert started is not None and (started["host"], started["attempt"]) == (0, n)
        assert before <= started["started_at"] <= after
    assert os.listdir(tmp_path / "tmp") == []  # the local copies went with the work dir


def test_sigterm_saves_the_checkpoint_and_leaves_without_a_result(store, tmp_path):
    marker = tmp_path / "saved"
    request = JobRequest(func=save_then_wait, args=(str(marker),))
    flags = stage(store, request)
    proc = start(flags, env_for(store, tmp_path, **{ck.SYNC_S_ENV: "3600"}))
    wait_for("the function to save", marker.exists)
    assert manifest_files(store) == {}  # an hour between syncs: nothing up yet
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert manifest_files(store) == {"model.bin": b"step 7"}
    assert "SIGTERM: checkpoints saved" in out
    assert not store.exists(artifact_key(request.job_id, "result.pkl"))
    assert os.listdir(tmp_path / "tmp") == []


def test_a_failing_function_still_saves_at_exit(store, tmp_path):
    marker = tmp_path / "saved"
    request = JobRequest(func=save_then_wait, args=(str(marker), True))
    env = env_for(store, tmp_path, **{ck.SYNC_S_ENV: "3600"})
    proc = run_runner(stage(store, request), env)
    assert proc.returncode == 1
    assert str(read_result(store, request.job_id)["exception"]) == "training diverged"
    assert manifest_files(store) == {"model.bin": b"step 7"}


def test_checkpoints_are_synced_while_the_function_runs(store, tmp_path):
    marker = tmp_path / "saved"
    request = JobRequest(func=save_then_wait, args=(str(marker),))
    proc = start(stage(store, request), env_for(store, tmp_path, **{ck.SYNC_S_ENV: "0.2"}))
    try:
        wait_for("a periodic sync", lambda: manifest_files(store))
        assert manifest_files(store) == {"model.bin": b"step 7"} and proc.poll() is None
    finally:
        Path(str(marker) + ".release").touch()
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out


def test_without_a_slot_the_function_still_gets_both_variables(store, tmp_path):
    request = JobRequest(func=bump_step)
    proc = run_runner(stage(store, request), {"TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    result = read_result(store, request.job_id)["result"]
    assert (result["attempt"], result["before"]) == ("1", None)
    assert store.list("checkpoints/") == []
    assert ck.read_started(store, request.job_id)["attempt"] == 1


def test_each_host_has_its_own_files_and_workers_write_no_start_record(store, tmp_path):
    request = JobRequest(func=bump_step)
    proc = run_runner(stage(store, request), {**env_for(store, tmp_path), "TPU_WORKER_ID": "1"})
    assert proc.returncode == 0, proc.stderr
    host1 = ck.host_key(ck.checkpoint_key(TASK, "any"), 1)
    assert store.exists(host1 + ck.MANIFEST_NAME) and store.exists(host1 + "attempts/000001")
    assert store.list(HOST0) == [] and ck.read_started(store, request.job_id) is None
