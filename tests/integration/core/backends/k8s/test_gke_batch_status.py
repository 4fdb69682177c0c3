"""A batch's status costs a constant number of API calls, however many children it has.

500 child Jobs and their pods carry the batch's group label, as the GKE backend
and the Job controller would create them; the test plays the controller and the
kubelet through the API (tests/fixtures/k8s_double).  One poll by
``GkeBackend.batch_status`` (sync and async) and one ``KineticBatchTrigger`` step
must each list Jobs and pods once, for 5 children as for 500, and get every
child's status right.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.k8s import status as ks
from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import GROUP_LABEL, job_manifest
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from airflow_provider_kinetic.gcp.gke_auth import (
    ClusterEndpoint,
    GkeApiClientFactory,
    GoogleTokenSource,
)
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from tests.fixtures import records
from tests.fixtures.google_creds import FakeCredentials
from tests.fixtures.k8s_double import K8sDouble, by_code_under_test, to_json

NS = "batch-ns"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
BUCKET = "proj-kn-c1-jobs"
SELECTOR = f"{GROUP_LABEL}=%s"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def worker(**state: Any) -> list[dict[str, Any]]:
    return [{"name": "kinetic-worker", "state": state}]


#: kind -> (Job status patch, pod status patch, expected (status, reason)); a child's
#: kind is KINDS[index % len(KINDS)], so 5 children have one of each.
KINDS: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[JobStatus, str | None]]] = {
    "succeeded": (
        {"succeeded": 1},
        {"phase": "Succeeded", "containerStatuses": worker(terminated={"exitCode": 0})},
        (JobStatus.SUCCEEDED, None),
    ),
    "failed": (
        {"failed": 1},
        {"phase": "Failed", "containerStatuses": worker(terminated={"exitCode": 3})},
        (JobStatus.FAILED, ks.REASON_NONZERO_EXIT),
    ),
    "running": (
        {},
        {"phase": "Running", "containerStatuses": worker(running={})},
        (JobStatus.RUNNING, None),
    ),  # fmt: skip
    "pending": (
        {},
        {"phase": "Pending", "containerStatuses": worker(waiting={"reason": "ContainerCreating"})},
        (JobStatus.PENDING, None),
    ),
    "unschedulable": (
        {},
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available",
                }
            ],
        },  # fmt: skip
        (JobStatus.PENDING, ks.REASON_UNSCHEDULABLE),
    ),
}


def kind_of(index: int) -> str:
    return list(KINDS)[index % len(KINDS)]


def child_job(group_id: str, index: int) -> dict[str, Any]:
    """Child ``index`` of the batch as the backend submits it (group label included)."""
    job_id = f"job-{group_id[-4:]}{index:04x}"
    spec = build_job_spec(
        SpecInputs(
            job_id=job_id,
            bucket=BUCKET,
            context_uri=f"gs://{BUCKET}/_payload/context.zip",
            payload_uri=f"gs://{BUCKET}/_payload/payload.pkl",
            result_uri=f"gs://{BUCKET}/{job_id}/result.pkl",
            payload_sha256="a" * 64,
            context_sha256="b" * 64,
            accelerator=parse_accelerator("cpu"),
            image="us-docker.pkg.dev/proj/kn-c1/base:cpu-0123456789ab",
            output_dir=f"gs://{BUCKET}/outputs/{index}",
            namespace=NS,
            extra_labels={GROUP_LABEL: group_id},
        )
    )
    body = to_json(job_manifest(spec))
    body["metadata"]["creationTimestamp"] = now()  # a real API server sets it
    return body


async def add_child(api: K8sDouble, group_id: str, index: int, with_pod: bool = True) -> dict:
    """Create child ``index`` (and its pod, in the state of its kind) through the API."""
    job = child_job(group_id, index)
    name = job["metadata"]["name"]
    await api.create(JOBS, job)
    job_status, pod_status, _ = KINDS[kind_of(index)]
    if with_pod:
        template = job["spec"]["template"]
        meta = {**template["metadata"], "name": f"{name}-p{index:04x}", "creationTimestamp": now()}
        await api.create(PODS, {"metadata": meta, "spec": template["spec"]})
        await api.patch_status(f"{PODS}/{meta['name']}", {**pod_status, "startTime": now()})
    if job_status and with_pod:
        await api.patch_status(f"{JOBS}/{name}", job_status)
    job_id = job["metadata"]["labels"]["job-id"]
    return records.handle(job_id, BUCKET, "gke", namespace=NS, k8s_name=name)


async def add_group(api: K8sDouble, group_id: str, n: int, with_pods: bool = True) -> list[dict]:
    """``n`` children; the set-up traffic is forgotten as it goes (each request to the
    double costs O(its history), see ``K8sDouble.forget_requests``)."""
    handles = []
    for index in range(n):
        handles.append(await add_child(api, group_id, index, with_pods))
        api.forget_requests()
    return handles


async def counted(api: K8sDouble, call: Awaitable[Any]) -> tuple[Any, list[tuple[str, str]]]:
    """Await ``call``; return its value and the (path, labelSelector) of the requests it sent."""
    before = len(api.requests)
    value = await call
    sent = by_code_under_test(api.requests[before:])
    return value, [(r.url.path, r.params.get("labelSelector", "")) for r in sent]


def expected(handles: list[JobHandle]) -> dict[str, tuple[JobStatus, str | None]]:
    return {h.job_id: KINDS[kind_of(i)][2] for i, h in enumerate(handles)}


@pytest.fixture
def backend(api: K8sDouble) -> GkeBackend:
    """The production client factory (Google token source) against the double."""
    endpoint = ClusterEndpoint(host=str(api.url).rstrip("/"))
    return GkeBackend(GkeApiClientFactory(endpoint, GoogleTokenSource(FakeCredentials())))


#: The list of the namespace's events that says why unschedulable children wait (the
#: autoscaler's word, ``k8s/pending.py``): at most once a minute per namespace.
EVENTS_LIST = (f"/api/v1/namespaces/{NS}/events", "")


def without_events(sent: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [call for call in sent if call != EVENTS_LIST]


async def test_one_poll_is_two_list_calls_for_5_or_500_children(api, backend) -> None:
    small = await add_group(api, "grp-0000aaaa", 5)
    large = await add_group(api, "grp-0000bbbb", 500)
    events = 0
    for group_id, handles in (("grp-0000aaaa", small), ("grp-0000bbbb", large)):
        lists = [(JOBS, SELECTOR % group_id), (PODS, SELECTOR % group_id)]
        reports, sent = await counted(
            api, asyncio.to_thread(backend.batch_status, group_id, handles)
        )
        assert without_events(sent) == lists
        events += sent.count(EVENTS_LIST)
        assert {j: (r.status, r.reason) for j, r in reports.items()} == expected(handles)
        areports, sent = await counted(api, backend.abatch_status(group_id, handles))
        assert without_events(sent) == lists and areports == reports
        events += sent.count(EVENTS_LIST)
    assert events == 1  # the first poll's, for every unschedulable child of both batches
    counts = {kind: sum(kind_of(i) == kind for i in range(500)) for kind in KINDS}
    assert counts == dict.fromkeys(KINDS, 100)


@pytest.mark.parametrize("n", [5, 500])
async def test_batch_trigger_step_costs_the_same_for_5_or_500(
    api, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    group_id = f"grp-{n:08x}"
    handles = await add_group(api, group_id, n)
    monkeypatch.setattr("google.auth.default", lambda scopes=None, **_: (FakeCredentials(), "p"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}),
    )
    config = KineticConfig(
        backend="gke", bucket=BUCKET, project="proj", zone="us-central1-a", cluster="c1",
        namespace=NS, endpoint={"host": str(api.url).rstrip("/"), "ca_data": None},
    )  # fmt: skip
    state = records.batch_state(
        n,
        {i: h.job_id for i, h in enumerate(handles)},
        root=BUCKET,
        backend="gke",
        group_id=group_id,
    )
    state.active = dict(enumerate(handles))
    state = state.to_dict()
    # One poll's cost: no settling hold (``triggers.settle``, which would poll again).
    quiet = {
        "config": config_to_json(config),
        "poll_interval": 0.01,
        "log_bytes_per_poll": 0,
        "not_before": 0.0,
    }
    trigger = KineticBatchTrigger(state=state, **quiet)
    event, sent = await counted(api, anext(trigger.run()))
    assert without_events(sent) == [(JOBS, SELECTOR % group_id), (PODS, SELECTOR % group_id)]
    assert sent.count(EVENTS_LIST) == 1  # why the unschedulable children wait, once
    payload = event.payload
    assert payload["status"] == "changed" and payload["state"] == state
    # Children's live logs add a bounded number of reads, however many children run.
    trigger = KineticBatchTrigger(
        state=state, config=quiet["config"], poll_interval=0.01, not_before=0.0
    )
    _, sent = await counted(api, anext(trigger.run()))
    assert EVENTS_LIST not in sent  # within the minute: the first trigger's read
    assert sent[:2] == [(JOBS, SELECTOR % group_id), (PODS, SELECTOR % group_id)]
    reads = [path for path, _ in sent[2:] if path.endswith("/log")]
    assert 0 < len(reads) <= batchlogs.CHILDREN_PER_POLL and len(sent) - 2 == 2 * len(reads)
    done = {j: s for j, s in expected(handles).items() if s[0].is_terminal}
    assert {j: (JobStatus(f["status"]), f["reason"]) for j, f in payload["finished"].items()} == (
        done
    )
    assert len(done) == 2 * n // len(KINDS)


async def test_children_without_pods_yet_cost_no_extra_calls(api, backend) -> None:
    handles = await add_group(api, "grp-0000cccc", 50, with_pods=False)
    reports, sent = await counted(
        api, asyncio.to_thread(backend.batch_status, "grp-0000cccc", handles)
    )
    assert {r.status for r in reports.values()} == {JobStatus.PENDING}
    assert len(sent) <= 3
