"""LeaderWorkerSet hosts finish once: a pod that exits is restarted (and its group
recreated), so the runner idles after success (Ready through the probe file) and a
restarted host never runs the function again; a failure stays a failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from airflow_provider_kinetic.core.backends.k8s import status as ks
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.waiting import DEADLINE_S, wait_for
from tests.integration.runner.test_runner import REPO_ROOT, stage


def count_runs(marker: str, fail: bool) -> str:
    with open(marker, "a") as f:
        f.write("run\n")
    if fail:
        raise RuntimeError("this host fails")
    return "done"


def start(flags: list[str], finished: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KINETIC_LWS": "1",
           "KINETIC_FINISHED_FILE": str(finished)}  # fmt: skip
    for var in ("TPU_WORKER_ID", "LWS_WORKER_INDEX"):
        env.pop(var, None)
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_kinetic.runner", *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_ready(proc: subprocess.Popen, finished: Path) -> None:
    def ready() -> bool:
        if finished.exists():
            return True
        assert proc.poll() is None, proc.communicate()[0]  # it idles once finished
        return False

    wait_for("the runner to write its finished file", ready)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(DEADLINE_S)


def test_success_idles_ready_and_a_restart_does_not_run_again(tmp_path):
    store = LocalStore(str(tmp_path / "bucket"))
    marker, finished = tmp_path / "runs", tmp_path / "finished"
    flags = stage(store, JobRequest(func=count_runs, args=(str(marker), False)))
    first = start(flags, finished)
    wait_ready(first, finished)
    assert first.poll() is None  # idling, not exited: the group is not recreated
    stop(first)
    finished.unlink()
    again = start(flags, finished)  # what a restart of the pod does
    wait_ready(again, finished)
    stop(again)
    assert marker.read_text().count("run") == 1  # the function ran once
    job_id = flags[flags.index("--result-gcs") + 1].split("/")[-2]
    assert store.exists(f"{job_id}/finished-0-ok") and store.exists(f"{job_id}/result.pkl")


def test_failure_exits_and_a_restart_fails_at_once(tmp_path):
    store = LocalStore(str(tmp_path / "bucket"))
    marker, finished = tmp_path / "runs", tmp_path / "finished"
    flags = stage(store, JobRequest(func=count_runs, args=(str(marker), True)))
    for _ in range(2):
        proc = start(flags, finished)
        out, _ = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 1, out
    assert "already failed: not running the function again" in out
    assert marker.read_text().count("run") == 1 and not finished.exists()


def test_a_ready_leader_is_finished():
    leader = {
        "metadata": {"name": "keras-pathways-job-1-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "kinetic-worker", "state": {"running": {}}}],
        },
    }
    lws = {"metadata": {"name": "keras-pathways-job-1"}, "status": {}}
    report = ks.pathways_status(lws, [leader], leader_name="keras-pathways-job-1-0")
    assert report.status is JobStatus.SUCCEEDED
    leader["status"]["conditions"][0]["status"] = "False"
    report = ks.pathways_status(lws, [leader], leader_name="keras-pathways-job-1-0")
    assert report.status is JobStatus.RUNNING
