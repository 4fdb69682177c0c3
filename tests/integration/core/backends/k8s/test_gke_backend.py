"""The GKE and Pathways backends against a loopback Kubernetes API (tests/fixtures/k8s_double).

The real ``kubernetes`` and ``kubernetes_asyncio`` clients talk HTTP to kmock's
emulator; the tests play the controllers and the kubelet by creating pods and
events and patching ``/status`` through the same API.  Sync backend calls run in
a thread because the API double serves on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.k8s import logs as k8s_logs
from airflow_provider_kinetic.core.backends.k8s import status as ks
from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend, KubernetesApiError
from airflow_provider_kinetic.core.backends.k8s.manifests import (
    GROUP_LABEL,
    job_manifest,
    lws_manifest,
)
from airflow_provider_kinetic.core.backends.k8s.pathways import PathwaysBackend
from airflow_provider_kinetic.core.backends.k8s.queues import QueuePositions
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.catalog.capacity_gke import QUEUE_LABEL
from airflow_provider_kinetic.core.jobs.classify import classify
from airflow_provider_kinetic.core.spec.failure import FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.spec.pod import JobSpec, SpecInputs, build_job_spec
from airflow_provider_kinetic.gcp.gke_auth import (
    ClusterEndpoint,
    GkeApiClientFactory,
    GoogleTokenSource,
)
from tests.fixtures import records
from tests.fixtures.google_creds import FakeCredentials
from tests.fixtures.k8s_double import K8sDouble, forget_log_cursors, to_json

NS = "default"
JOB_ID = "job-00c0ffee"
JOB = f"kinetic-{JOB_ID}"
LWS = f"keras-pathways-{JOB_ID}"
JOB_PATH = f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}"
PODS = f"/api/v1/namespaces/{NS}/pods"
LWS_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"


@pytest.fixture(autouse=True)
def _fresh_log_cursors() -> None:
    forget_log_cursors()  # each test starts as a new process would


def make_spec(accelerator: str = "gpu:l4", job_id: str = JOB_ID, **extra: Any) -> JobSpec:
    bucket = "proj-kn-c1-jobs"
    return build_job_spec(
        SpecInputs(
            job_id=job_id,
            bucket=bucket,
            accelerator=parse_accelerator(accelerator),
            context_uri=f"gs://{bucket}/{job_id}/context.zip",
            payload_uri=f"gs://{bucket}/{job_id}/payload.pkl",
            result_uri=f"gs://{bucket}/{job_id}/result.pkl",
            payload_sha256="a" * 64,
            context_sha256="b" * 64,
            image="us-docker.pkg.dev/proj/kn-c1/base:gpu-0123456789ab",
            output_dir=f"gs://{bucket}/outputs/",
            identity={"dag_id": "d", "task_id": "t"},
            **extra,
        )
    )


HANDLE = records.handle(JOB_ID, "b", "gke", namespace=NS, k8s_name=JOB)
LWS_HANDLE = records.handle(JOB_ID, "b", "pathways", namespace=NS, k8s_name=LWS)


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def both(backend: GkeBackend, handle: JobHandle) -> ks.StatusReport:
    """Status through the sync client (in a thread) and the async client; they must agree."""
    sync = await asyncio.to_thread(backend.status, handle)
    assert await backend.astatus(handle) == sync
    return sync


async def add_job(api: K8sDouble, created_s: float = 5, **status: Any) -> None:
    """A Job as the backend would create it, 'created' ``created_s`` seconds ago.

    (A real API server sets ``creationTimestamp`` itself; the double keeps what it is sent.)
    """
    body = to_json(job_manifest(make_spec()))
    body["metadata"]["creationTimestamp"] = ago(created_s)
    await api.create(f"/apis/batch/v1/namespaces/{NS}/jobs", body)
    if status:
        await api.patch_status(JOB_PATH, status)


async def add_pod(
    api: K8sDouble,
    name: str,
    owner: str = JOB,
    created_s: float = 5,
    spot: bool = False,
    sidecar: bool = False,
    labels: dict[str, str] | None = None,
    **status: Any,
) -> None:
    """A pod of ``owner`` (label job-name, plus the template's ``labels``) with ``status``
    as the kubelet would report it."""
    containers = [{"name": "kinetic-worker", "image": "img"}]
    if sidecar:
        containers.append({"name": "gke-gcsfuse-sidecar", "image": "fuse"})
    spec: dict[str, Any] = {"containers": containers}
    if spot:
        spec["nodeSelector"] = {"cloud.google.com/gke-spot": "true"}
    meta = {"name": name, "labels": {**(labels or {}), "job-name": owner},
            "creationTimestamp": ago(created_s)}  # fmt: skip
    await api.create(PODS, {"metadata": meta, "spec": spec})
    await api.patch_status(f"{PODS}/{name}", {"phase": "Pending", **status})


def worker(state: dict[str, Any], last: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    status: dict[str, Any] = {"name": "kinetic-worker", "state": state}
    if last:
        status["lastState"] = last
    return [status]


async def add_event(api: K8sDouble, about: str, kind: str, reason: str, message: str) -> None:
    await api.create(
        f"/api/v1/namespaces/{NS}/events",
        {
            "metadata": {"name": f"{about}.{reason.lower()}"},
            "involvedObject": {"kind": kind, "name": about, "namespace": NS},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "firstTimestamp": ago(60),
            "lastTimestamp": ago(1),
            "count": 3,
        },
    )


# ---- submit ----------------------------------------------------------------------------------


async def test_submit_sends_exactly_the_job_manifest(api: K8sDouble) -> None:
    spec = make_spec("tpu-v5litepod-2x2")
    await asyncio.to_thread(GkeBackend(api.client_factory("tok")).submit, spec)
    (post,) = api.sent("POST")
    assert post.url.path == f"/apis/batch/v1/namespaces/{NS}/jobs"
    assert json.loads(post.body) == to_json(job_manifest(spec))
    assert post.headers["Authorization"] == "Bearer tok"
    with pytest.raises(KubernetesApiError) as info:  # a job id is never submitted twice
        await asyncio.to_thread(GkeBackend(api.client_factory()).submit, spec)
    assert info.value.status == 409


async def test_manifest_is_the_dry_run_of_submit(api: K8sDouble) -> None:
    spec = make_spec("tpu-v6e-2x4")
    assert GkeBackend(api.client_factory()).manifest(spec) == job_manifest(spec)
    assert PathwaysBackend(api.client_factory()).manifest(spec) == lws_manifest(spec)
    assert api.requests == []  # no network for a dry run


# ---- status ------------------------------------------------------------------------------------


async def test_status_walks_through_every_job_status(api: K8sDouble) -> None:
    backend = GkeBackend(api.client_factory())
    assert (await both(backend, HANDLE)).status is JobStatus.NOT_FOUND
    await asyncio.to_thread(backend.submit, make_spec())
    report = await both(backend, HANDLE)
    assert (report.status, report.reason) == (JobStatus.PENDING, None)
    waiting = worker({"waiting": {"reason": "ContainerCreating"}})
    await add_pod(api, f"{JOB}-x1", containerStatuses=waiting)
    assert await both(backend, HANDLE) == ks.StatusReport(
        JobStatus.PENDING, None, "ContainerCreating"
    )
    await api.patch_status(f"{PODS}/{JOB}-x1", {"phase": "Running"})
    assert (await both(backend, HANDLE)).status is JobStatus.RUNNING
    await api.patch_status(JOB_PATH, {"succeeded": 1})
    assert (await both(backend, HANDLE)).status is JobStatus.SUCCEEDED
    # Only the pods of this Job were asked for, by label.
    lists = [r for r in api.sent("GET", "/pods") if not r.url.path.endswith("/log")]
    assert {r.params["labelSelector"] for r in lists} == {f"job-name={JOB}"}


async def test_failed_job_reports_the_exit_code(api: K8sDouble) -> None:
    cond = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
    }
    await add_job(api, failed=1, conditions=[cond])
    done = {"terminated": {"exitCode": 3, "reason": "Error"}}
    await add_pod(api, f"{JOB}-x1", phase="Failed", containerStatuses=worker(done))
    report = await both(GkeBackend(api.client_factory()), HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, ks.REASON_NONZERO_EXIT)
    assert "exited with code 3" in report.message


async def test_failed_job_without_pods_reports_the_job_condition(api: K8sDouble) -> None:
    cond = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too slow"}
    await add_job(api, conditions=[cond])
    report = await both(GkeBackend(api.client_factory()), HANDLE)
    assert report == ks.StatusReport(
        JobStatus.FAILED, ks.REASON_JOB_FAILED, "DeadlineExceeded: too slow"
    )


YOUNG, OLD = 30, 4000  # seconds: inside / beyond every grace period and timeout
PULL = {
    "ErrImagePull": ks.REASON_ERR_IMAGE_PULL,
    "ImagePullBackOff": ks.REASON_IMAGE_PULL_BACKOFF,
    "InvalidImageName": ks.REASON_INVALID_IMAGE_NAME,
}


@pytest.mark.parametrize("age", [YOUNG, OLD])
@pytest.mark.parametrize("kubelet_reason", list(PULL))
async def test_image_pull_errors(api: K8sDouble, kubelet_reason: str, age: float) -> None:
    await add_job(api, created_s=age)
    message = 'Back-off pulling image "us-docker.pkg.dev/proj/kn-c1/base:gpu-nope"'
    waiting = worker({"waiting": {"reason": kubelet_reason, "message": message}})
    await add_pod(api, f"{JOB}-x1", created_s=age, startTime=ago(age), containerStatuses=waiting)
    report = await both(GkeBackend(api.client_factory(), image_pull_grace_s=300), HANDLE)
    assert report.reason == PULL[kubelet_reason]
    assert report.status is (JobStatus.PENDING if age == YOUNG else JobStatus.FAILED)
    assert "gpu-nope" in report.message
    failure = classify(HANDLE.job_id, report)  # what the task says once it failed
    assert (failure.failure_class, failure.phase) == (FailureClass.INFRA, "startup")


@pytest.mark.parametrize("age", [YOUNG, OLD])
@pytest.mark.parametrize(
    ("message", "hint"),
    [
        ("0/3 nodes are available: 3 Insufficient google.com/tpu.", "free accelerators"),
        ("0/5 nodes are available: 5 Insufficient nvidia.com/gpu.", "free accelerators"),
        (
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
            "node selector",
        ),
    ],
)
async def test_unschedulable(api: K8sDouble, message: str, hint: str, age: float) -> None:
    await add_job(api, created_s=age)
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    await add_pod(api, f"{JOB}-x1", created_s=age, conditions=[cond])
    report = await both(GkeBackend(api.client_factory(), schedule_timeout_s=1800), HANDLE)
    assert report.reason == ks.REASON_UNSCHEDULABLE
    assert report.status is (JobStatus.PENDING if age == YOUNG else JobStatus.FAILED)
    assert message in report.message and hint in report.message
    failure = classify(HANDLE.job_id, report)  # past the wait: no capacity came
    assert (failure.failure_class, failure.phase) == (FailureClass.NO_CAPACITY, "startup")


@pytest.mark.parametrize("age", [YOUNG, OLD])
async def test_failed_create_missing_service_account(api: K8sDouble, age: float) -> None:
    await add_job(api, created_s=age)
    text = (
        'Error creating: pods "kinetic-job-00c0ffee-" is forbidden: error looking up '
        'service account default/kinetic: serviceaccount "kinetic" not found'
    )
    await add_event(api, JOB, "Job", "FailedCreate", text)
    await add_event(api, "someone-else", "Job", "FailedCreate", "not about us")
    report = await both(GkeBackend(api.client_factory(), create_grace_s=180), HANDLE)
    assert report.reason == ks.REASON_FAILED_CREATE
    assert report.status is (JobStatus.PENDING if age == YOUNG else JobStatus.FAILED)
    assert report.message == text
    assert {r.params["fieldSelector"] for r in api.sent("GET", "/events")} == {
        f"involvedObject.name={JOB}"
    }


async def test_failed_mount_after_the_grace(api: K8sDouble) -> None:
    await add_job(api, created_s=OLD)
    waiting = worker({"waiting": {"reason": "ContainerCreating"}})
    await add_pod(api, f"{JOB}-x1", created_s=OLD, startTime=ago(OLD), containerStatuses=waiting)
    text = "MountVolume.SetUp failed for volume gcs-fuse-0: PermissionDenied on bucket"
    await add_event(api, f"{JOB}-x1", "Pod", "FailedMount", text)
    report = await both(GkeBackend(api.client_factory()), HANDLE)
    assert report == ks.StatusReport(JobStatus.FAILED, ks.REASON_FAILED_MOUNT, text)


async def test_container_config_error(api: K8sDouble) -> None:
    await add_job(api, created_s=OLD)
    waiting = {
        "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "x" not found'}
    }
    await add_pod(api, f"{JOB}-x1", startTime=ago(OLD), containerStatuses=worker(waiting))
    report = await both(GkeBackend(api.client_factory()), HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, ks.REASON_CONTAINER_CONFIG)


KILLED: dict[str, dict[str, Any]] = {
    ks.REASON_OOM_KILLED: {
        "containerStatuses": worker({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}),
    },
    ks.REASON_EVICTED: {
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
        ],
    },
    ks.REASON_PREEMPTED: {
        "reason": "Terminated",
        "message": "Pod was terminated in response to imminent node shutdown.",
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
        ],
        "containerStatuses": worker({"terminated": {"exitCode": 143, "reason": "Error"}}),
    },
    ks.REASON_NODE_LOST: {
        "reason": "NodeLost",
        "message": "Node gke-pool-1-abc which was running pod x1 is unresponsive",
    },
}
#: The class each way of being killed has (``core.jobs.classify``), and its exit code.
KILLED_AS = {
    ks.REASON_OOM_KILLED: (FailureClass.INFRA, 137),
    ks.REASON_EVICTED: (FailureClass.INFRA, None),
    ks.REASON_PREEMPTED: (FailureClass.PREEMPTION, None),
    ks.REASON_NODE_LOST: (FailureClass.INFRA, None),
}


@pytest.mark.parametrize("counted", [True, False], ids=["job-failed", "before-job-counts"])
@pytest.mark.parametrize("reason", list(KILLED))
async def test_killed_pods(api: K8sDouble, reason: str, counted: bool) -> None:
    await add_job(api, **({"failed": 1} if counted else {}))
    await add_pod(api, f"{JOB}-x1", spot=True, phase="Failed", **KILLED[reason])
    report = await both(GkeBackend(api.client_factory()), HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, reason)
    if reason == ks.REASON_PREEMPTED:
        assert "spot VM was reclaimed" in report.message
    failure = classify(HANDLE.job_id, report)
    assert (failure.failure_class, failure.exit_code) == KILLED_AS[reason]


def test_reasons_are_distinct() -> None:
    names = [n for n in dir(ks) if n.startswith("REASON_")]
    values = [getattr(ks, n) for n in names]
    assert len(names) >= 16 and len(set(values)) == len(values)


async def test_batch_status_lists_the_group_once(api: K8sDouble) -> None:
    backend = GkeBackend(api.client_factory())
    group = {GROUP_LABEL: "grp-12345678"}
    creating = worker({"waiting": {"reason": "ContainerCreating"}})
    states = {
        "job-0000000a": {"phase": "Running"},
        "job-0000000b": {"phase": "Failed", **KILLED[ks.REASON_OOM_KILLED]},
        "job-0000000c": {"containerStatuses": creating},
        "job-0000000d": {"phase": "Running"},  # submitted without the group label
    }
    for job_id, status in states.items():
        labels = group if job_id != "job-0000000d" else {}
        await asyncio.to_thread(backend.submit, make_spec(job_id=job_id, extra_labels=labels))
        await add_pod(api, f"kinetic-{job_id}-x1", f"kinetic-{job_id}", labels=labels, **status)
    await api.patch_status(
        f"/apis/batch/v1/namespaces/{NS}/jobs/kinetic-job-0000000b", {"failed": 1}
    )
    handles = [records.handle(j, "b", "gke", namespace=NS) for j in states]
    before = len(api.requests)
    reports = await asyncio.to_thread(backend.batch_status, "grp-12345678", handles)
    assert {j: (r.status, r.reason) for j, r in reports.items()} == {
        "job-0000000a": (JobStatus.RUNNING, None),
        "job-0000000b": (JobStatus.FAILED, ks.REASON_OOM_KILLED),
        "job-0000000c": (JobStatus.PENDING, None),
        "job-0000000d": (JobStatus.RUNNING, None),
    }
    calls = [(r.url.path, r.params.get("labelSelector")) for r in api.requests[before:]]
    assert calls == [
        (f"/apis/batch/v1/namespaces/{NS}/jobs", f"{GROUP_LABEL}=grp-12345678"),
        (PODS, f"{GROUP_LABEL}=grp-12345678"),
        (f"/apis/batch/v1/namespaces/{NS}/jobs/kinetic-job-0000000d", None),  # fallback
        (PODS, "job-name=kinetic-job-0000000d"),
    ]
    assert await backend.abatch_status("grp-12345678", handles) == reports


async def add_queued_job(api: K8sDouble, job_id: str, queue: str = "team-a") -> JobHandle:
    """A Job Kueue has not admitted: created suspended in local queue ``queue``."""
    body = to_json(job_manifest(make_spec(job_id=job_id)))
    body["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
    body["spec"]["suspend"] = True
    await api.create(f"/apis/batch/v1/namespaces/{NS}/jobs", body)
    return records.handle(job_id, "b", "gke", namespace=NS, k8s_name=f"kinetic-{job_id}")


async def test_a_queued_job_says_its_position_from_kueues_visibility_api(api: K8sDouble) -> None:
    """``position 3 of 7 in queue team-a``, read once per queue per minute (the status,
    the async status and a batch's listed read share the backend's one answer)."""
    clock = [0.0]
    backend = GkeBackend(api.client_factory())
    backend._queue_positions = QueuePositions(clock=lambda: clock[0])
    mine = await add_queued_job(api, "job-0000q003")
    ahead = [f"kinetic-job-0000q00{i}" for i in range(3)]
    behind = [f"kinetic-job-0000q00{i}" for i in range(4, 8)]
    api.pending_workloads[(NS, "team-a")] = ahead[:2] + [mine.k8s_name] + behind
    report = await both(backend, mine)
    assert report == ks.StatusReport(
        JobStatus.PENDING,
        ks.REASON_NOT_ADMITTED,
        "waiting for admission: position 3 of 7 in queue team-a",
    )
    assert report.describe() == (
        "PENDING (NotAdmitted): waiting for admission: position 3 of 7 in queue team-a"
    )
    visibility = "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/default/localqueues/team-a"
    assert len(api.sent("GET", visibility)) == 1  # the second read used the first's answer
    api.pending_workloads[(NS, "team-a")] = [mine.k8s_name]  # those ahead were admitted
    other = await add_queued_job(api, "job-0000q009")
    group = await asyncio.to_thread(backend.batch_status, "g", [mine, other])
    assert group[mine.job_id].message.endswith("position 3 of 7 in queue team-a")  # < 1 min
    assert group[other.job_id].message == "waiting for admission in queue team-a"  # not listed
    clock[0] += 60  # a minute later: read again
    report = await asyncio.to_thread(backend.status, mine)
    assert report.message == "waiting for admission: position 1 of 1 in queue team-a"
    assert len(api.sent("GET", visibility)) == 2


async def test_without_the_visibility_api_a_queued_job_says_its_queue(api: K8sDouble) -> None:
    backend = GkeBackend(api.client_factory())
    mine = await add_queued_job(api, "job-0000q0aa", "team-b")  # the double: 404 for it
    report = await both(backend, mine)
    assert report.message == "waiting for admission in queue team-b"
    api.fail("GET", "/pendingworkloads", status=403, times=5)  # RBAC refusing it
    fresh = GkeBackend(api.client_factory())
    assert (await asyncio.to_thread(fresh.status, mine)).message == (
        "waiting for admission in queue team-b"
    )


# ---- logs ------------------------------------------------------------------------------------


async def test_log_tailing_shows_each_line_once(api: K8sDouble) -> None:
    backend = GkeBackend(api.client_factory())
    await add_job(api)
    await add_pod(api, f"{JOB}-x1", sidecar=True)  # two containers: must name ours
    assert await asyncio.to_thread(backend.read_logs, HANDLE, 0) == ("", 0)  # not started

    await api.patch_status(f"{PODS}/{JOB}-x1", {"phase": "Running"})
    old = time.time_ns() - 600 * 10**9
    api.write_log(NS, f"{JOB}-x1", "epoch 1", at_ns=old)
    api.write_log(NS, f"{JOB}-x1", '{"loss": 0.5}', at_ns=old + 1)
    api.write_log(NS, f"{JOB}-x1", "epoch 2")
    api.partial[(NS, f"{JOB}-x1")] = "epoch 3 (half writ"
    text, offset = await asyncio.to_thread(backend.read_logs, HANDLE, 0)
    assert (text, offset) == ('epoch 1\n{"loss": 0.5}\nepoch 2\n', 3)
    # Each line's pod timestamp comes with it (TimedText), exactly as the double wrote it.
    assert text.times[:2] == (old, old + 1)  # timing-ok: stamps compared, not elapsed time

    del api.partial[(NS, f"{JOB}-x1")]
    api.write_log(NS, f"{JOB}-x1", "epoch 3 (half written)", "epoch 4")
    text, offset = await asyncio.to_thread(backend.read_logs, HANDLE, offset)
    assert (text, offset) == ("epoch 3 (half written)\nepoch 4\n", 5)
    # The second read asked only for a window around the last line shown ("epoch 2"),
    # not for the whole log again: the 10-minute-old lines were not sent.
    params, served = api.log_reads[-1]
    assert params["container"] == "kinetic-worker"
    assert int(params["sinceSeconds"]) <= 2 + k8s_logs.LOG_SINCE_MARGIN_S and served == 3

    assert await backend.aread_logs(HANDLE, offset) == ("", 5)
    same = time.time_ns()
    api.write_log(NS, f"{JOB}-x1", "same instant A", at_ns=same)
    assert await backend.aread_logs(HANDLE, 5) == ("same instant A\n", 6)
    api.write_log(NS, f"{JOB}-x1", "same instant B", at_ns=same)
    assert await asyncio.to_thread(backend.read_logs, HANDLE, 6) == ("same instant B\n", 7)

    forget_log_cursors()  # another process resumes from the offset alone
    api.write_log(NS, f"{JOB}-x1", "epoch 5")
    fresh = GkeBackend(api.client_factory())
    assert await asyncio.to_thread(fresh.read_logs, HANDLE, 7) == ("epoch 5\n", 8)
    assert "sinceSeconds" not in api.log_reads[-1][0]


async def test_capped_log_reads_drain_a_chatty_pod_in_chunks(api: K8sDouble) -> None:
    """A capped read shows whole lines up to ``max_bytes`` and moves the offset past
    just those; the lines it read past the cap serve the next reads without
    fetching the log again.  Lines with one timestamp split across reads are each
    shown once, and an uncapped read (another caller) still continues exactly."""
    backend = GkeBackend(api.client_factory())
    await add_job(api)
    await add_pod(api, f"{JOB}-x1")
    await api.patch_status(f"{PODS}/{JOB}-x1", {"phase": "Running"})
    same = time.time_ns() - 10**9
    lines = [f"step {i:04d} " + "y" * 39 for i in range(400)]  # 50 bytes each with "\n"
    for i, line in enumerate(lines):  # pairs of lines share a timestamp
        api.write_log(NS, f"{JOB}-x1", line, at_ns=same + i // 2)
    shown, offset, reads = [], 0, len(api.log_reads)
    while len(shown) < 231:  # 11 reads of 21 lines: the last one splits a pair
        text, offset = await backend.aread_logs(HANDLE, offset, max_bytes=1051)
        assert 0 < len(text.encode()) <= 1051 and text.endswith("\n")
        shown += text.splitlines()
        assert offset == len(shown)
    assert len(api.log_reads) == reads + 1  # one fetch; the other reads were served from it
    assert len(shown) == 231 and len(text.splitlines()) == 21  # 21 lines of 50 bytes
    api.write_log(NS, f"{JOB}-x1", "after the burst")
    text, end = await asyncio.to_thread(backend.read_logs, HANDLE, offset)  # uncapped
    assert shown + text.splitlines() == [*lines, "after the burst"] and end == 401
    assert await backend.aread_logs(HANDLE, end, max_bytes=1001) == ("", end)
    # One line longer than the cap still comes, whole (a pod log's offset counts lines).
    api.write_log(NS, f"{JOB}-x1", "z" * 5000, "tail")
    assert await backend.aread_logs(HANDLE, end, max_bytes=1001) == ("z" * 5000 + "\n", 402)
    assert await asyncio.to_thread(backend.read_logs, HANDLE, 402, 1001) == ("tail\n", 403)


async def test_logs_of_a_missing_job_are_empty(api: K8sDouble) -> None:
    backend = GkeBackend(api.client_factory())
    assert await asyncio.to_thread(backend.read_logs, HANDLE, 4) == ("", 4)
    assert await PathwaysBackend(api.client_factory()).aread_logs(LWS_HANDLE, 0) == ("", 0)


# ---- cancel ----------------------------------------------------------------------------------


async def test_cancel_deletes_in_foreground_and_tolerates_404(api: K8sDouble) -> None:
    backend = GkeBackend(api.client_factory())
    await asyncio.to_thread(backend.submit, make_spec())
    await asyncio.to_thread(backend.cancel, HANDLE)
    (delete,) = api.sent("DELETE")
    assert delete.url.path == JOB_PATH
    assert delete.params["propagationPolicy"] == "Foreground"
    assert (await both(backend, HANDLE)).status is JobStatus.NOT_FOUND
    await asyncio.to_thread(backend.cancel, HANDLE)  # already gone: no error
    await backend.acancel(HANDLE)
    # A cancel reads the object first (ownership, k8s/ownership.py): gone, nothing to delete.
    assert [r.params["propagationPolicy"] for r in api.sent("DELETE")] == ["Foreground"]


# ---- token refresh ---------------------------------------------------------------------------


async def test_401_rebuilds_the_client_once_and_retries(api: K8sDouble) -> None:
    await add_job(api, succeeded=1)
    api.revoked_tokens.add("expired")
    factory = api.client_factory("expired", "fresh")
    backend = GkeBackend(factory)
    assert (await asyncio.to_thread(backend.status, HANDLE)).status is JobStatus.SUCCEEDED
    assert factory.calls == ["expired", "fresh"]
    reads = [r.headers["Authorization"] for r in api.sent("GET", JOB_PATH)]
    assert reads == ["Bearer expired", "Bearer fresh"]
    await asyncio.to_thread(backend.status, HANDLE)
    assert factory.calls == ["expired", "fresh"]  # the fresh client is kept


async def test_401_twice_is_an_error(api: K8sDouble) -> None:
    api.revoked_tokens.update({"a", "b", "c"})
    factory = api.client_factory("a", "b", "c")
    with pytest.raises(KubernetesApiError) as info:
        await asyncio.to_thread(GkeBackend(factory).status, HANDLE)
    assert info.value.status == 401 and factory.calls == ["a", "b"]


async def test_async_401_invalidates_the_factory_and_retries(api: K8sDouble) -> None:
    await add_job(api)
    api.revoked_tokens.add("old")

    class Factory:
        def __init__(self) -> None:
            self.token, self.invalidated = "old", 0
            self.base = api.client_factory()

        def __call__(self) -> Any:
            client = self.base()
            client.configuration.api_key = {"BearerToken": self.token}
            return client

        def invalidate(self) -> None:
            self.invalidated += 1
            self.token = "new"

    factory = Factory()
    report = await GkeBackend(factory).astatus(HANDLE)
    assert report.status is JobStatus.PENDING and factory.invalidated == 1
    auths = [r.headers["Authorization"] for r in api.sent("GET", JOB_PATH)]
    assert auths == ["Bearer old", "Bearer new"]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_gke_factory_refreshes_a_rejected_token(api: K8sDouble, path: str) -> None:
    """The production factory (google-auth token source) against the API double."""
    await add_job(api, succeeded=1)
    creds = FakeCredentials()
    endpoint = ClusterEndpoint(host=str(api.url).rstrip("/"))
    backend = GkeBackend(GkeApiClientFactory(endpoint, GoogleTokenSource(creds)))
    assert (await both(backend, HANDLE)).status is JobStatus.SUCCEEDED
    assert creds.refreshes == 1
    api.revoked_tokens.add("tok-1")  # revoked before its expiry
    call = backend.astatus(HANDLE) if path == "async" else asyncio.to_thread(backend.status, HANDLE)
    assert (await call).status is JobStatus.SUCCEEDED
    assert creds.refreshes == 2
    tokens = [r.headers["Authorization"] for r in api.sent("GET", JOB_PATH)]
    assert tokens[-2:] == ["Bearer tok-1", "Bearer tok-2"]


# ---- Pathways (LeaderWorkerSet) --------------------------------------------------------------


async def test_pathways_create_status_logs_cancel(api: K8sDouble) -> None:
    spec = make_spec("tpu-v6e-2x4")
    backend = PathwaysBackend(api.client_factory())
    assert (await both(backend, LWS_HANDLE)).status is JobStatus.NOT_FOUND
    await asyncio.to_thread(backend.submit, spec)
    (post,) = api.sent("POST")
    assert post.url.path == LWS_PATH
    assert json.loads(post.body) == to_json(lws_manifest(spec, "leaderworkerset.x-k8s.io/v1"))
    assert [r.url.path for r in api.requests].count("/apis/") == 1  # discovered once

    assert (await both(backend, LWS_HANDLE)).status is JobStatus.PENDING
    running = {"phase": "Running", "containerStatuses": worker({"running": {}})}
    await add_pod(api, f"{LWS}-0", owner=LWS, **running)
    await add_pod(api, f"{LWS}-0-1", owner=LWS, **running)
    assert (await both(backend, LWS_HANDLE)).status is JobStatus.RUNNING

    api.write_log(NS, f"{LWS}-0", "leader: step 1")
    api.write_log(NS, f"{LWS}-0-1", "worker: step 1")
    assert await asyncio.to_thread(backend.read_logs, LWS_HANDLE, 0) == ("leader: step 1\n", 1)

    # The leader finished and was restarted by its StatefulSet: success shows in lastState.
    restarted = worker({"running": {}}, last={"terminated": {"exitCode": 0, "reason": "Completed"}})
    await api.patch_status(f"{PODS}/{LWS}-0", {"containerStatuses": restarted})
    assert (await both(backend, LWS_HANDLE)).status is JobStatus.SUCCEEDED

    await asyncio.to_thread(backend.cancel, LWS_HANDLE)
    (delete,) = api.sent("DELETE")
    assert delete.url.path == f"{LWS_PATH}/{LWS}"
    assert delete.params["propagationPolicy"] == "Foreground"
    assert (await both(backend, LWS_HANDLE)).status is JobStatus.NOT_FOUND
    await backend.acancel(LWS_HANDLE)  # 404: done


async def test_pathways_failing_worker_fails_the_job(api: K8sDouble) -> None:
    await api.create(LWS_PATH, to_json(lws_manifest(make_spec("tpu-v6e-2x4"))))
    await add_pod(api, f"{LWS}-0", owner=LWS, phase="Succeeded")
    crashed = worker({"running": {}}, last={"terminated": {"exitCode": 1, "reason": "Error"}})
    await add_pod(api, f"{LWS}-0-1", owner=LWS, phase="Running", containerStatuses=crashed)
    report = await both(PathwaysBackend(api.client_factory()), LWS_HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, ks.REASON_WORKER_FAILED)
    assert f"{LWS}-0-1" in report.message
    failure = classify(LWS_HANDLE.job_id, report)  # no payload: a crash outside the function
    assert (failure.failure_class, failure.exit_code) == (FailureClass.INFRA, 1)


async def test_pathways_worker_2_failing_while_the_leader_runs_fails_the_job_at_once(
    api: K8sDouble,
) -> None:
    """A 4-host slice: the leader and workers 1 and 3 run, worker 2's container crashed.
    The first status read fails the job naming worker 2 (not the leader's timeout), and
    worker 2's own log tail can be read."""
    await api.create(LWS_PATH, to_json(lws_manifest(make_spec("tpu-v6e-4x4"))))
    await add_pod(api, f"{LWS}-0", owner=LWS, phase="Running")
    for n in (1, 3):
        await add_pod(api, f"{LWS}-0-{n}", owner=LWS, phase="Running")
    crashed = worker({"running": {}}, last={"terminated": {"exitCode": 2, "reason": "Error"}})
    await add_pod(api, f"{LWS}-0-2", owner=LWS, phase="Running", containerStatuses=crashed)
    report = await both(PathwaysBackend(api.client_factory()), LWS_HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, ks.REASON_WORKER_FAILED)
    assert f"{LWS}-0-2" in report.message
    failure = classify(LWS_HANDLE.job_id, report, host_count=4)
    assert (failure.failure_class, failure.exit_code) == (FailureClass.INFRA, 2)
    # Its own log is shown, not only the leader's (core.jobs.finish reads its tail).
    api.write_log(NS, f"{LWS}-0", "leader: waiting for the slice")
    api.write_log(NS, f"{LWS}-0-2", *[f"step {n}" for n in range(60)], "host 2: bad shard")
    backend = PathwaysBackend(api.client_factory())
    text = await asyncio.to_thread(backend.read_host_log, LWS_HANDLE, 2, 50)
    assert text is not None and text.splitlines()[-1] == "host 2: bad shard"
    assert len(text.splitlines()) == 50 and "leader" not in text
    assert await asyncio.to_thread(backend.read_host_log, LWS_HANDLE, 0, 50) is None


async def test_pathways_unschedulable_worker_and_failed_create(api: K8sDouble) -> None:
    body = to_json(lws_manifest(make_spec("tpu-v6e-4x4")))
    body["metadata"]["creationTimestamp"] = ago(OLD)
    await api.create(LWS_PATH, body)
    backend = PathwaysBackend(api.client_factory())
    await add_event(api, LWS, "StatefulSet", "FailedCreate", "exceeded quota: tpu")
    assert await both(backend, LWS_HANDLE) == ks.StatusReport(
        JobStatus.FAILED, ks.REASON_FAILED_CREATE, "exceeded quota: tpu"
    )
    await add_pod(api, f"{LWS}-0", owner=LWS, phase="Running")
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 Insufficient google.com/tpu.",
    }
    await add_pod(api, f"{LWS}-0-3", owner=LWS, created_s=YOUNG, conditions=[cond])
    report = await both(backend, LWS_HANDLE)
    assert (report.status, report.reason) == (JobStatus.RUNNING, ks.REASON_UNSCHEDULABLE)


@pytest.mark.parametrize(("served", "expected"), [("v2", "v2"), (None, "v1")])
async def test_pathways_discovers_the_lws_version(
    api: K8sDouble, served: str | None, expected: str
) -> None:
    del api.resources["leaderworkerset.x-k8s.io/v1/leaderworkersets"]
    if served:
        api.resources[f"leaderworkerset.x-k8s.io/{served}/leaderworkersets"] = {}
    spec = make_spec("tpu-v6e-2x4")
    await asyncio.to_thread(PathwaysBackend(api.client_factory()).submit, spec)
    (post,) = api.sent("POST")
    assert post.url.path == LWS_PATH.replace("/v1/", f"/{expected}/")
    assert json.loads(post.body)["apiVersion"] == f"leaderworkerset.x-k8s.io/{expected}"
