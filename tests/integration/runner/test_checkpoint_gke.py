"""The checkpoint example preempted mid-run on the GKE backend, against the Kubernetes
API double and fake-gcs-server: the test kubelet runs the real runner for the first
Job's pod until two checkpoint snapshots are in the bucket, then preempts it as GKE
does a spot VM (SIGTERM, the grace period, the pod Failed with a ``DisruptionTarget``
condition); the operator resubmits (``preemption_retries``) and the second Job runs to
the end, starting from the last saved step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from airflow_provider_kinetic.core.backends.local.backend import RUNNER_MODULE
from airflow_provider_kinetic.core.jobs.checkpoint import (
    CHECKPOINT_URI_ENV,
    MANIFEST_NAME,
    SYNC_S_ENV,
    host_key,
)
from airflow_provider_kinetic.core.storage import store_for_uri
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.k8s_double import ThreadedDouble, by_code_under_test, forget_log_cursors
from tests.fixtures.local_conn import set_conn
from tests.fixtures.waiting import wait_for
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures, by import
    IMAGE,
    JOBS,
    NS,
    PODS,
    Kubelet,
    ago,
    google_token,
    pod_status,
)
from tests.integration.runner.test_checkpoint_resume import (
    LOGICAL,
    defaults,
    steps,
    uninterrupted_weights,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously

#: The jobs' checkpoint sync interval, set by this node (seconds).
SYNC_S = 0.5
#: Snapshots the first pod publishes before its node goes.
MIN_SYNCS = 2
#: The function's seconds per step here (the example's default is 0.05).
STEP_S = 0.2
#: GKE's default terminationGracePeriodSeconds.
GRACE_S = 30
PREEMPTED = {
    "phase": "Failed",
    "reason": "Terminated",
    "message": "Pod was terminated in response to imminent node shutdown.",
    "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
    ],
    "containerStatuses": [
        {"name": "kinetic-worker", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}
    ],
}


class PreemptingKubelet(Kubelet):
    """Plays the node for two Jobs: the first is preempted mid-run, the second runs."""

    def __init__(self, double: ThreadedDouble) -> None:
        super().__init__(double)
        self.jobs: list[dict[str, Any]] = []
        self.logs: list[list[str]] = []
        self.codes: list[int] = []

    def play(self) -> None:
        for n in (1, 2):
            posts = self.until(
                f"Job {n}", lambda d, n=n: len(by_code_under_test(d.sent("POST", JOBS))) >= n
            )
            if not posts:
                return
            job = json.loads(by_code_under_test(self.api.sent("POST", JOBS))[n - 1].body)
            self.jobs.append(job)
            name, template = job["metadata"]["name"], job["spec"]["template"]
            pod_path = f"{PODS}/{name}-p{n}"
            meta = {**template["metadata"], "name": f"{name}-p{n}", "creationTimestamp": ago(0)}
            self.api.create(PODS, {"metadata": meta, "spec": template["spec"]})
            creating = {"reason": "ContainerCreating"}
            self.api.patch_status(pod_path, pod_status("Pending", ago(0), waiting=creating))
            self.api.patch_status(pod_path, pod_status("Running", running={}))
            container = template["spec"]["containers"][0]
            proc = self.start_runner(container)
            if n == 1:
                self.await_snapshots(container, proc)
                proc.send_signal(signal.SIGTERM)  # the node's shutdown notice
            try:
                out = proc.communicate(timeout=GRACE_S if n == 1 else 120)[0]
            except subprocess.TimeoutExpired:  # past the grace period: killed
                proc.kill()
                out = proc.communicate()[0]
            self.codes.append(proc.returncode)
            self.logs.append(out.splitlines())
            self.api.write_log(NS, f"{name}-p{n}", *self.logs[-1])
            if n == 1:
                self.api.patch_status(pod_path, PREEMPTED)
                self.api.patch_status(f"{JOBS}/{name}", {"failed": 1})
            else:
                code = proc.returncode
                done = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
                phase = "Succeeded" if code == 0 else "Failed"
                self.api.patch_status(pod_path, pod_status(phase, terminated=done))
                counts = {"succeeded": 1} if code == 0 else {"failed": 1}
                self.api.patch_status(f"{JOBS}/{name}", counts)

    def start_runner(self, container: dict[str, Any]) -> subprocess.Popen:
        """The container's command as this machine's runner, with this node's interval."""
        env = {e["name"]: self.env_value(e) for e in container["env"]}
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
        env[SYNC_S_ENV] = str(SYNC_S)
        return subprocess.Popen(
            [sys.executable, "-u", "-m", RUNNER_MODULE, *container["args"]],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def await_snapshots(self, container: dict[str, Any], proc: subprocess.Popen) -> None:
        """Until the pod's periodic syncs published MIN_SYNCS snapshots to the bucket."""
        uri = next(e["value"] for e in container["env"] if e["name"] == CHECKPOINT_URI_ENV)
        store, slot = store_for_uri(uri)
        key = host_key(slot, 0) + MANIFEST_NAME

        def published() -> bool:
            assert proc.poll() is None, "the first pod ended before it was preempted"
            if not store.exists(key):
                return False
            return json.loads(store.read_bytes(key))["sync"] >= MIN_SYNCS

        wait_for(f"{MIN_SYNCS} checkpoint snapshots", published, timeout=90)


@pytest.fixture
def gke_default(
    monkeypatch,
    api: ThreadedDouble,  # noqa: F811 - the fixture
    gcs_bucket: str,
    google_token,  # noqa: F811 - the fixture
) -> tuple[ThreadedDouble, str]:
    """``kinetic_default`` (the example's connection) -> the GKE double and the bucket."""
    extras = {"backend": "gke", "bucket": gcs_bucket, "project": "proj", "zone": "us-central1-a",
              "cluster": "c1", "namespace": NS, "image": IMAGE,
              "endpoint": {"host": api.host, "ca_data": None}}  # fmt: skip
    set_conn(monkeypatch, "kinetic_default", extras)
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    forget_log_cursors()
    return api, gcs_bucket


def test_preempted_pod_resumes_from_its_last_save(load_dag, gke_default, tmp_path, monkeypatch):
    double, bucket = gke_default
    kubelet = PreemptingKubelet(double)
    kubelet.start()
    try:
        dag = load_dag("checkpoint_resume.py", "checkpoint_resume")
        # Steps long enough that the first pod is mid-run at its preemption even when
        # its checkpoint syncs lag under load (at the example's 0.05 s the function
        # once returned before the node's notice came: 60 steps in 3 s).
        dag.get_task("train").op_kwargs = {"step_s": STEP_S}
        dr = dag.test(logical_date=LOGICAL)
    finally:
        kubelet.abort.set()
        kubelet.join(150)
    if kubelet.error is not None:
        raise kubelet.error
    assert dr.state == "success", task_states(dr)
    result = {(t, k): v for (t, k, _), v in xcoms(dr).items()}[("train", "return_value")]
    assert len(kubelet.jobs) == 2 and kubelet.codes == [143, 0]
    # Two jobs, one slot: the checkpoint location is the task run's, not the job's.
    uris = [
        next(e["value"] for e in j["spec"]["template"]["spec"]["containers"][0]["env"]
             if e["name"] == CHECKPOINT_URI_ENV)
        for j in kubelet.jobs
    ]  # fmt: skip
    assert uris[0] == uris[1] and uris[0].startswith(f"gs://{bucket}/checkpoints/tasks/")
    log1, log2 = "\n".join(kubelet.logs[0]), "\n".join(kubelet.logs[1])
    ran1, saved1, ran2 = steps(log1, 1), steps(log1, 1, "saved step"), steps(log2, 2)
    total, every = defaults()["steps"], defaults()["every"]
    assert saved1 and ran1 == list(range(1, len(ran1) + 1)) and 0 < len(ran1) < total
    assert "SIGTERM: checkpoints saved" in log1
    assert result["attempt"] == 2 and saved1[-1] <= result["resumed_from"] <= ran1[-1]
    assert ran2 == list(range(result["resumed_from"] + 1, total + 1))
    assert len(ran1) + len(ran2) <= total + SYNC_S / STEP_S
    assert len(ran1) - result["resumed_from"] <= every
    assert np.allclose(result["w"], uninterrupted_weights(tmp_path, monkeypatch), atol=0)
