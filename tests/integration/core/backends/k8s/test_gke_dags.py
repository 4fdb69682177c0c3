"""Real Airflow 3.3 ``dag.test()`` runs on the GKE backend, against the loopback API double.

Nothing of the provider is mocked: the operator, hook, GKEHook, ``kubernetes`` /
``kubernetes_asyncio`` clients and the GCS store run for real, against the
thread-hosted Kubernetes API double and fake-gcs-server.  The one thing faked is
Google's OAuth token (it cannot exist offline): ``google.auth.default`` hands out
:class:`FakeCredentials`, so the ``google_cloud_default`` connection is still read
by providers-google.

A "kubelet" thread plays the Job controller and the node: it waits for the Job,
creates its pod, runs the real runner on this machine with the container's args
and env, copies the runner's output into the pod log, and reports the outcome
through the API (``/status`` patches), as the kubelet would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
import pytest

from airflow_provider_kinetic.core.backends.k8s import status as ks
from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest
from airflow_provider_kinetic.core.backends.k8s.ownership import owner_token, stamp
from airflow_provider_kinetic.core.backends.local.backend import RUNNER_MODULE
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import checkpoint_env
from airflow_provider_kinetic.core.jobs.signing import job_key
from airflow_provider_kinetic.core.keys.peer.registry import peer_token
from airflow_provider_kinetic.core.runtime.context import build_context
from airflow_provider_kinetic.core.spec.identity import key_part
from airflow_provider_kinetic.core.spec.peerport import SCOPE_ENV, TOKEN_ENV
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.google_creds import FakeCredentials
from tests.fixtures.k8s_double import (
    ThreadedDouble,
    by_code_under_test,
    forget_log_cursors,
    to_json,
)
from tests.fixtures.local_conn import set_conn

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")
NS = "ml-jobs"
IMAGE = "us-docker.pkg.dev/proj/kn-c1/base:cpu-0123456789ab"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
MODES = ["sync", "deferrable"]

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def google_token(monkeypatch: pytest.MonkeyPatch) -> list[FakeCredentials]:
    """``google.auth.default`` -> FakeCredentials; the list holds every one handed out."""
    handed: list[FakeCredentials] = []

    def default(scopes: Any = None, **_: Any) -> tuple[FakeCredentials, str]:
        handed.append(FakeCredentials())
        return handed[-1], "proj"

    monkeypatch.setattr("google.auth.default", default)
    return handed


@pytest.fixture
def connections(
    monkeypatch: pytest.MonkeyPatch, api: ThreadedDouble, gcs_bucket: str, google_token: list
) -> str:
    """``kinetic_gke`` / ``kinetic_gke_pull`` pointing at the double and the bucket."""
    extras = {
        "backend": "gke",
        "bucket": gcs_bucket,
        "project": "proj",
        "zone": "us-central1-a",
        "cluster": "c1",
        "namespace": NS,
        "image": IMAGE,
        "endpoint": {"host": api.host, "ca_data": None},
    }
    for conn_id, more in (("KINETIC_GKE", {}), ("KINETIC_GKE_PULL", {"image_pull_grace_s": 1})):
        set_conn(monkeypatch, conn_id, {**extras, **more})
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    forget_log_cursors()
    return gcs_bucket


class Kubelet(threading.Thread):
    """Plays the Job controller and the node for the one Job the DAG run creates.

    ``outcome``: ``run`` (run the real runner; pod and Job report its exit code) or
    ``pull`` (the image cannot be pulled).  With ``await_log_read`` the pod stays
    Running until the operator has read the whole log (sync mode shows it live); with
    ``await_trigger``, until the trigger has listed the Job (deferrable mode: the task
    has deferred, whatever the machine's speed; a pod that ended before the task's
    first poll would be collected without a deferral).
    """

    def __init__(
        self,
        api: ThreadedDouble,
        outcome: str = "run",
        await_log_read: bool = False,
        await_trigger: bool = False,
    ):
        super().__init__(name="kubelet", daemon=True)
        self.api, self.outcome, self.await_log_read = api, outcome, await_log_read
        self.await_trigger = await_trigger
        self.job: dict[str, Any] = {}
        self.pod = ""
        self.log_lines: list[str] = []
        self.error: BaseException | None = None
        #: Set when the DAG run is over: stop waiting for what will not happen.
        self.abort = threading.Event()

    def run(self) -> None:
        try:
            self.play()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc

    def until(self, what: str, check: Callable[[Any], Any], timeout_s: float = 180) -> Any:
        """``check(double)`` once truthy; ``None`` if the DAG run ended first."""
        found = self.api.wait_for(what, lambda d: self.abort.is_set() or check(d), timeout_s)
        return None if self.abort.is_set() else found

    def play(self) -> None:
        posts = self.until("the Job", lambda d: by_code_under_test(d.sent("POST", JOBS)))
        if posts:
            self.play_job(json.loads(posts[0].body))

    def play_job(self, job: dict[str, Any]) -> None:
        """Be the Job controller and the node for ``job`` (as sent to the API)."""
        self.job = job
        name, template = self.job["metadata"]["name"], self.job["spec"]["template"]
        self.pod = f"{name}-x7k2p"
        pod_path = f"{PODS}/{self.pod}"
        meta = {**template["metadata"], "name": self.pod, "creationTimestamp": ago(0)}
        self.api.create(PODS, {"metadata": meta, "spec": template["spec"]})
        if self.outcome == "pull":
            waiting = {"reason": "ErrImagePull", "message": f'pulling image "{IMAGE}": not found'}
            self.api.patch_status(pod_path, pod_status("Pending", ago(60), waiting=waiting))
            return
        creating = {"reason": "ContainerCreating"}
        self.api.patch_status(pod_path, pod_status("Pending", ago(0), waiting=creating))
        self.api.patch_status(pod_path, pod_status("Running", running={}))
        if self.await_trigger and not self.until(
            "the trigger to list the Job while the pod runs",
            lambda d: any(r.url.path == JOBS for r in d.sent("GET")),
        ):
            return
        code = self.run_the_runner(template["spec"]["containers"][0])
        if self.await_log_read and not self.until(
            "the operator to read the whole log while the pod runs",
            lambda d: any(served == len(self.log_lines) for _, served in d.log_reads),
        ):
            return
        done = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        phase = "Succeeded" if code == 0 else "Failed"
        self.api.patch_status(pod_path, pod_status(phase, terminated=done))
        self.api.patch_status(f"{JOBS}/{name}", {"succeeded": 1} if code == 0 else {"failed": 1})

    def env_value(self, entry: dict[str, Any]) -> str:
        """A container env entry's value, resolving ``secretKeyRef`` as the kubelet does."""
        if "value" in entry:
            return entry["value"]
        if "fieldRef" in entry["valueFrom"]:  # the downward API: this "node" is loopback
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", entry
            return "127.0.0.1"
        ref = entry["valueFrom"]["secretKeyRef"]
        secret = self.api.read(f"/api/v1/namespaces/{NS}/secrets/{ref['name']}")
        assert secret is not None, f"the pod needs Secret {ref['name']}, which does not exist"
        if ref["key"] in (secret.get("stringData") or {}):
            return secret["stringData"][ref["key"]]
        return base64.b64decode(secret["data"][ref["key"]]).decode()

    def run_the_runner(self, container: dict[str, Any]) -> int:
        """The container's args and env, with this interpreter's runner module as command."""
        env = {e["name"]: self.env_value(e) for e in container["env"]}
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
        proc = subprocess.run(
            [sys.executable, "-u", "-m", RUNNER_MODULE, *container["args"]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )
        self.log_lines = proc.stdout.decode().splitlines()
        self.api.write_log(NS, self.pod, *self.log_lines)
        return proc.returncode


def pod_status(phase: str, start: str | None = None, **state: Any) -> dict[str, Any]:
    """A pod ``status`` as the kubelet reports it: phase, start time, the worker's state."""
    status = {"phase": phase, "containerStatuses": [{"name": "kinetic-worker", "state": state}]}
    return {**status, "startTime": start} if start else status


def run_dag(
    load_dag: Callable[[str, str], Any],
    dag_id: str,
    kubelet: Kubelet,
    dag_file: str = "kinetic_gke_dags.py",
) -> Any:
    """``dag.test()`` of ``dag_id`` while ``kubelet`` plays the node; its error re-raised."""
    kubelet.start()
    try:
        dr = load_dag(dag_file, dag_id).test(logical_date=LOGICAL)
    finally:
        kubelet.abort.set()
        kubelet.join(150)
    if kubelet.error is not None:
        raise kubelet.error
    return dr


def _xcoms(dr: Any) -> dict[tuple[str, str], Any]:
    return {(t, k): v for (t, k, _), v in xcoms(dr).items()}


def expected_job(bucket: str, job_id: str, dr: Any, task_id: str, work_slot: str) -> dict[str, Any]:
    """The Job that ``job_manifest`` builds for this run, from the artifacts in the bucket
    (``work_slot``: the work digest's segment of the checkpoint slot, which
    tests/integration/core/jobs/test_work_identity.py proves)."""
    store = GcsStore(bucket)
    run = key_part(dr.run_id)
    # The context: the DAG's project (the DAGs folder here), content-addressed and shared.
    dags = os.environ["AIRFLOW__CORE__DAGS_FOLDER"]
    context = build_context(os.path.join(dags, "kinetic_gke_dags.py"), ceilings=[dags])
    assert store.read_bytes(context.key) == context.data
    identity = {
        "dag_id": dr.dag_id,
        "task_id": task_id,
        "run_id": dr.run_id,
        "map_index": -1,
        "try_number": 1,
    }
    spec = build_job_spec(
        SpecInputs(
            job_id=job_id,
            bucket=bucket,
            context_uri=f"gs://{bucket}/{context.key}",
            payload_uri=f"gs://{bucket}/{job_id}/payload.pkl",
            result_uri=f"gs://{bucket}/{job_id}/result.pkl",
            payload_sha256=hashlib.sha256(store.read_bytes(f"{job_id}/payload.pkl")).hexdigest(),
            context_sha256=context.sha256,
            accelerator=parse_accelerator("cpu"),
            image=IMAGE,
            output_dir=f"gs://{bucket}/outputs/{dr.dag_id}/{run}/{task_id}/-1",
            namespace=NS,
            identity=identity,
            # The job's peer scope (a single job: its id), then the task run's
            # checkpoint slot (core.jobs.checkpoint), stable across tries.
            env={SCOPE_ENV: job_id, **checkpoint_env(store, identity, job_id, work=work_slot)},
            # Only a reference reaches the manifest; the values are in the Secret.
            secrets={
                "KINETIC_RESULT_KEY": job_key(deployment_secret(), job_id),
                TOKEN_ENV: peer_token(deployment_secret(), job_id),
            },
        )
    )
    # Created with the owner token of the deployment secret (core/backends/k8s/ownership.py).
    return to_json(stamp(job_manifest(spec), owner_token(deployment_secret(), NS, spec.name)))


@pytest.mark.parametrize("mode", MODES)
def test_gke_job_end_to_end(load_dag, connections, api, google_token, capfd, mode):
    bucket = connections
    kubelet = Kubelet(api, await_log_read=mode == "sync", await_trigger=mode == "deferrable")
    dr = run_dag(load_dag, f"kinetic_gke_ok_{mode}", kubelet)
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)

    job = kubelet.job
    job_id = job["metadata"]["labels"]["job-id"]
    x = _xcoms(dr)
    assert x[("steps", "return_value")] == {
        "sum": 45,
        "job_id": job_id,
        "bucket": bucket,
        "output_dir": x[("steps", "output_dir")].rstrip("/"),
    }
    # A gs:// output dir travels as a directory URI, ready for Data(...) downstream.
    assert x[("steps", "output_dir")].endswith("/")
    handle = x[("steps", "kinetic_job")]
    assert {k: handle[k] for k in ("backend", "k8s_name", "namespace", "bucket_name")} == {
        "backend": "gke", "k8s_name": f"kinetic-{job_id}", "namespace": NS, "bucket_name": bucket,
    }  # fmt: skip
    assert (handle["project"], handle["cluster_name"], handle["zone"]) == (
        "proj", "c1", "us-central1-a",
    )  # fmt: skip
    assert handle["image_uri"] == IMAGE and handle["func_name"] == "gke_steps"

    # Collected: the Job is deleted, and (with cleanup="on_success") its store objects.
    assert api.read(f"{JOBS}/{job['metadata']['name']}") is None
    # Its history outlives both: how it ended, where its log is, and the pod's log
    # itself, archived before the Job (and its pods) went.
    store = GcsStore(bucket)
    entry = history.read(store, job_id)
    assert (entry["state"], entry["backend"], entry["task_id"]) == ("SUCCEEDED", "gke", "steps")
    assert entry["log"].startswith("https://console.cloud.google.com/logs")
    assert history.read_log(store, job_id).splitlines() == kubelet.log_lines
    if mode == "deferrable":
        assert GcsStore(bucket).list(f"{job_id}/") == []
    else:  # The Job sent is exactly the manifest of this run's spec.
        env = {
            e["name"]: e.get("value")
            for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        slot = re.fullmatch(r".*/work/([0-9a-f]{32})/job/", env["KINETIC_CHECKPOINT_URI"])
        assert slot, env["KINETIC_CHECKPOINT_URI"]  # per task run and work
        assert job == expected_job(bucket, job_id, dr, "steps", slot.group(1))
    labels = job["metadata"]["labels"]
    assert labels["airflow-dag-id"] == dr.dag_id and labels["airflow-task-id"] == "steps"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    if mode == "sync":
        payload_sha = hashlib.sha256(GcsStore(bucket).read_bytes(f"{job_id}/payload.pkl"))
        assert container["args"][container["args"].index("--payload-sha256") + 1] == (
            payload_sha.hexdigest()
        )
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The result key reaches the pod from the job's Secret, never as a plain value.
    (key_ref,) = [e for e in container["env"] if e["name"] == "KINETIC_RESULT_KEY"]
    secret_name = f"kinetic-{job_id}-secrets"
    assert key_ref["valueFrom"] == {"secretKeyRef": {"name": secret_name, "key": key_ref["name"]}}
    secret = api.read(f"/api/v1/namespaces/{NS}/secrets/{secret_name}")
    assert secret["stringData"] == {
        "KINETIC_RESULT_KEY": job_key(deployment_secret(), job_id),
        TOKEN_ENV: peer_token(deployment_secret(), job_id),  # the job's peers' token
    }
    assert secret["metadata"]["labels"]["job-id"] == job_id
    posts = [r.url.path for r in api.requests() if r.method == "POST"]
    assert posts.index(f"/api/v1/namespaces/{NS}/secrets") < posts.index(JOBS)  # Secret first
    assert env["KINETIC_OUTPUT_DIR"] + "/" == x[("steps", "output_dir")]
    assert (env["JOB_ID"], env["GCS_BUCKET"]) == (job_id, bucket)

    # The pod's log reached the task log: every line once, in order.
    steps = [f"gke step {i}/3 of {job_id}" for i in (1, 2, 3)]
    assert all(line in kubelet.log_lines for line in steps)
    # Shown by the operator (sync) or, while deferred, by the trigger.
    shown = re.findall(
        rf"\[{job_id}\] (.*?) +\[(?:airflow\.task\.operators|airflow_provider_kinetic\.triggers)",
        out,
    )
    assert shown == kubelet.log_lines, out
    first = out.index(f"[{job_id}] {kubelet.log_lines[0]}")
    if mode == "sync":  # read while the pod ran, before the poll that saw it finish
        assert first < out.index(f"kinetic job {job_id}: SUCCEEDED")
    else:  # read live by the trigger while deferred, not again after the resume
        assert f"kinetic job {job_id} resumed" in out, out
        assert first < out.index(f"kinetic job {job_id} resumed")

    (post,) = api.sent("POST", JOBS)
    assert post.headers["Authorization"] == "Bearer tok-1"  # the Google token path ran
    assert google_token and all(c.refreshes <= 1 for c in google_token)
    # Collected: the Job is deleted at once (a LeaderWorkerSet has no TTL at all).
    assert [r.url.path for r in api.sent("DELETE")] == [f"{JOBS}/{job['metadata']['name']}"]


@pytest.mark.parametrize("mode", MODES)
def test_gke_failing_function_carries_the_remote_traceback(load_dag, connections, api, capfd, mode):
    kubelet = Kubelet(api, await_log_read=mode == "sync")
    dr = run_dag(load_dag, f"kinetic_gke_fail_{mode}", kubelet)
    out = "".join(capfd.readouterr())
    assert dr.state == "failed"
    assert {t: s for (t, _), s in task_states(dr).items()} == {"explode": "failed"}
    assert "ValueError: gke boom 7 from the pod" in out
    assert "Remote traceback" in out and "in gke_explodes" in out
    assert _xcoms(dr)[("explode", "kinetic_job")]["backend"] == "gke"
    assert len(api.sent("POST", JOBS)) == 1


@pytest.mark.parametrize("mode", MODES)
def test_gke_image_pull_error_fails_the_task(load_dag, connections, api, capfd, mode):
    kubelet = Kubelet(api, outcome="pull")
    dr = run_dag(load_dag, f"kinetic_gke_pull_{mode}", kubelet)
    out = "".join(capfd.readouterr())
    assert dr.state == "failed"
    assert ks.REASON_ERR_IMAGE_PULL in out and "failed (ErrImagePull)" in out
    assert len(api.sent("POST", JOBS)) == 1
    name = kubelet.job["metadata"]["name"]
    deletes = api.sent("DELETE", f"{JOBS}/{name}")
    assert len(deletes) == 1, "the Job stuck in ErrImagePull was left on the cluster"
