"""Why a GKE job still waits (issue 40): its pod's scheduling and cluster autoscaler
events, and its flex-start ProvisioningRequest's state, folded into its one line.

Against the Kubernetes API double: the tests play the scheduler, the cluster
autoscaler and Kueue by creating pods, events and ProvisioningRequests through the API.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.jobset import JobSetBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest, jobset_manifest
from airflow_provider_kinetic.core.backends.k8s.pending import (
    CONSUME_ANNOTATION,
    Seen,
    provreq_state,
    shared,
)
from airflow_provider_kinetic.core.backends.k8s.queues import QueuePositions
from airflow_provider_kinetic.core.catalog.capacity_gke import QUEUE_LABEL
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from tests.fixtures.k8s_double import K8sDouble, to_json
from tests.fixtures.triggerer import add_queued_job, paths, spec_for
from tests.integration.core.backends.k8s.test_gke_backend import make_spec

NS = "default"
EVENTS = f"/api/v1/namespaces/{NS}/events"
PROVREQS = f"/apis/autoscaling.x-k8s.io/v1/namespaces/{NS}/provisioningrequests"
UNFIT = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def add_unschedulable_job(
    api: K8sDouble, job_id: str, queue: str | None = None, request: str | None = None
) -> tuple[JobHandle, str]:
    """A Job whose pod the scheduler cannot place (PodScheduled False, Unschedulable);
    with ``queue``, admitted from that Kueue queue, its pod consuming ``request``."""
    spec = spec_for(job_id)
    body = to_json(job_manifest(spec))
    if queue:
        body["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
    await api.create(f"/apis/batch/v1/namespaces/{NS}/jobs", body)
    pod = f"{spec.name}-p"
    labels = spec.pod_template({"job-name": spec.name})["metadata"]["labels"]
    annotations = {CONSUME_ANNOTATION: request} if request else {}
    await api.create(
        f"/api/v1/namespaces/{NS}/pods",
        {"metadata": {"name": pod, "labels": labels, "annotations": annotations,
                      "creationTimestamp": ago(30)},
         "spec": {"containers": [{"name": "kinetic-worker", "image": "img"}]}},
    )  # fmt: skip
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": UNFIT}  # fmt: skip
    await api.patch_status(paths(job_id)[1], {"phase": "Pending", "conditions": [condition]})
    handle = JobHandle(job_id=job_id, backend="gke", bucket_name="b", namespace=NS,
                       k8s_name=spec.name)  # fmt: skip
    return handle, pod


async def add_event(api: K8sDouble, pod: str, reason: str, message: str, at_s: float) -> None:
    await api.create(
        EVENTS,
        {"metadata": {"name": f"{pod}.{reason.lower()}"},
         "involvedObject": {"kind": "Pod", "name": pod, "namespace": NS},
         "reason": reason, "message": message, "type": "Normal",
         "firstTimestamp": ago(at_s), "lastTimestamp": ago(at_s)},
    )  # fmt: skip


def provreq(name: str, workload: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    """A ProvisioningRequest as Kueue makes one for a Workload (its owner)."""
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta1",
                    "kind": "Workload",
                    "name": workload,
                    "uid": "u-1",
                },
            ],  # fmt: skip
        },
        "spec": {"provisioningClassName": "queued-provisioning.gke.io", "podSets": []},
        "status": {"conditions": list(conditions)},
    }


def cond(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": ago(5)}  # fmt: skip


def backend_at(api: K8sDouble, clock: list[float]) -> GkeBackend:
    backend = GkeBackend(api.client_factory())
    backend._why_seen = Seen(clock=lambda: clock[0])
    backend._queue_positions = QueuePositions(clock=lambda: clock[0])
    return backend


async def test_an_unschedulable_pod_says_what_the_autoscaler_said(api: K8sDouble) -> None:
    """The scheduler's reason, then the autoscaler's latest word, in one line; the
    namespace's events are listed once a minute, whatever the number of reads."""
    clock = [0.0]
    backend = backend_at(api, clock)
    handle, pod = await add_unschedulable_job(api, "job-0000u001")
    why = "pod didn't trigger scale-up: 1 max node group size reached"
    await add_event(api, pod, "FailedScheduling", UNFIT, at_s=20)
    await add_event(api, pod, "NotTriggerScaleUp", why, at_s=10)
    report = await asyncio.to_thread(backend.status, handle)
    assert report.status is JobStatus.PENDING
    assert report.describe() == (
        f"PENDING (Unschedulable): {UNFIT} (no node with free accelerators: check the node "
        f"pool, its size and quota); cluster autoscaler: no scale-up ({why})"
    )
    assert await backend.astatus(handle) == report  # the async read: the same line
    assert len(api.sent("GET", EVENTS)) == 1  # within the minute: the first list's answer
    up = "pod triggered scale-up: [{gke-c1-l4-pool 0->1 (max: 4)}]"
    await add_event(api, pod, "TriggeredScaleUp", up, at_s=1)
    assert (await asyncio.to_thread(backend.status, handle)) == report  # not read yet
    clock[0] += 60
    report = await asyncio.to_thread(backend.status, handle)
    assert report.message.endswith(f"; cluster autoscaler: scale-up triggered ({up})")
    assert len(api.sent("GET", EVENTS)) == 2


async def test_a_queued_job_says_its_flex_start_requests_state(api: K8sDouble) -> None:
    """Behind a queued-provisioning queue: the position, then the ProvisioningRequest
    Kueue made for the Job's Workload; Failed names its reason and message."""
    clock = [0.0]
    backend = backend_at(api, clock)
    mine = await add_queued_job(api, "job-0000f001")
    api.pending_workloads[(NS, "team-a")] = ["kinetic-job-other", mine.k8s_name]
    workload = f"job-{mine.k8s_name}-1a2b3"
    name = f"{workload}-dws-prov-1"
    await api.create(PROVREQS, provreq(name, workload, cond("Accepted", "Accepted")))
    await api.create(PROVREQS, provreq("job-kinetic-job-other-9f9f9-dws-prov-1", "x"))
    report = await asyncio.to_thread(backend.status, mine)
    assert report.describe() == (
        "PENDING (NotAdmitted): waiting for admission: position 2 of 2 in queue team-a; "
        f"flex-start request {name}: accepted, waiting for capacity"
    )
    assert await backend.astatus(mine) == report
    assert len(api.sent("GET", PROVREQS)) == 1
    failed = cond("Failed", "CapacityNotAvailable", "no v6e capacity in us-east5 before deadline")
    await api.patch_status(f"{PROVREQS}/{name}", {"conditions": [cond("Accepted"), failed]})
    clock[0] += 60
    report = await asyncio.to_thread(backend.status, mine)
    assert report.message == (
        "waiting for admission: position 2 of 2 in queue team-a; "
        f"flex-start request {name}: failed (CapacityNotAvailable: no v6e capacity in "
        "us-east5 before deadline)"
    )


async def test_an_admitted_pod_names_the_request_it_consumes(api: K8sDouble) -> None:
    """Admitted (the Job unsuspended), its pod waits for the nodes its request
    provisioned: the scheduler's reason, the autoscaler's word and the request, in
    one line; the request found by the pod's annotation, not by its Workload's name."""
    name = "job-kinetic-job-0000p001-ab12c-dws-prov-1"
    await api.create(PROVREQS, provreq(name, "some-workload", cond("Provisioned")))
    handle, pod = await add_unschedulable_job(api, "job-0000p001", "team-a", name)
    up = "pod triggered scale-up: [{gke-c1-v6e-flex 0->2 (max: 2)}]"
    await add_event(api, pod, "TriggeredScaleUp", up, at_s=3)
    report = await asyncio.to_thread(GkeBackend(api.client_factory()).status, handle)
    assert report.describe() == (
        f"PENDING (Unschedulable): {UNFIT} (no node with free accelerators: check the node "
        f"pool, its size and quota); cluster autoscaler: scale-up triggered ({up}); "
        f"flex-start request {name}: provisioned, nodes starting"
    )


async def test_without_the_crd_or_the_events_the_line_stays(api: K8sDouble) -> None:
    """A cluster without ProvisioningRequests (404) or refusing events (403): the line
    is what it was, and the status read still succeeds."""
    backend = GkeBackend(api.client_factory())
    mine = await add_queued_job(api, "job-0000f002", "team-b")  # no visibility answer
    api.fail("GET", "/provisioningrequests", status=404, times=1)
    report = await asyncio.to_thread(backend.status, mine)
    assert report.message == "waiting for admission in queue team-b"
    handle, _ = await add_unschedulable_job(api, "job-0000u002")
    api.fail("GET", "/events", status=403, times=1)
    report = await asyncio.to_thread(backend.status, handle)
    assert report.message == (
        f"{UNFIT} (no node with free accelerators: check the node pool, its size and quota)"
    )


def test_each_condition_reads_as_the_table_says() -> None:
    """The first true condition of the table wins; an Accepted-only request waits."""
    assert provreq_state(provreq("r", "w")) == "flex-start request r: created, not accepted yet"
    both = provreq("r", "w", cond("Accepted"), cond("Provisioned", "Provisioned", "ok"))
    assert provreq_state(both) == "flex-start request r: provisioned, nodes starting"
    revoked = provreq("r", "w", cond("Provisioned"), cond("CapacityRevoked", "", "preempted"))
    assert provreq_state(revoked) == "flex-start request r: capacity revoked (preempted)"
    expired = provreq("r", "w", cond("Provisioned"), cond("BookingExpired"))
    assert provreq_state(expired) == "flex-start request r: booking expired"


async def test_backends_made_per_request_share_one_read_a_minute(api: K8sDouble) -> None:
    """The Kinetic pages make a backend per status read; the deployment layer gives
    each the process's reads of its cluster (``pending.shared``), so polling a waiting
    job every second still lists its namespace's events once a minute."""
    handle, pod = await add_unschedulable_job(api, "job-0000u003")
    await add_event(api, pod, "NotTriggerScaleUp", "pod didn't trigger scale-up:", at_s=5)
    key = ("proj", "zone", "c1", id(api))  # this test's own cluster
    lines = set()
    for _ in range(3):
        backend = GkeBackend(api.client_factory())
        backend._why_seen = shared(key)
        lines.add((await asyncio.to_thread(backend.status, handle)).message)
    assert len(lines) == 1 and lines.pop().endswith("no scale-up (pod didn't trigger scale-up:)")
    assert len(api.sent("GET", EVENTS)) == 1


async def test_a_queued_jobset_says_its_place_and_its_request(api: K8sDouble) -> None:
    """A multi-slice job (a JobSet) behind a queue: Kueue's Workload is named after the
    JobSet (``jobset-NAME-xxxxx``), and the visibility API names the JobSet as owner."""
    spec = make_spec("tpu-v5p-2x2x2", job_id="job-0000s001", num_slices=2)
    body = to_json(jobset_manifest(spec))
    body["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "team-a"
    body["spec"]["suspend"] = True
    await api.create(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets", body)
    name = body["metadata"]["name"]
    api.pending_workloads[(NS, "team-a")] = [name]
    request = f"jobset-{name}-9e8d7-dws-prov-1"
    await api.create(PROVREQS, provreq(request, f"jobset-{name}-9e8d7", cond("Accepted")))
    handle = JobHandle(job_id="job-0000s001", backend="jobset", bucket_name="b",
                       namespace=NS, k8s_name=name)  # fmt: skip
    report = await asyncio.to_thread(JobSetBackend(api.client_factory()).status, handle)
    assert report.describe() == (
        "PENDING (NotAdmitted): waiting for admission: position 1 of 1 in queue team-a; "
        f"flex-start request {request}: accepted, waiting for capacity"
    )
