"""The multi-slice (JobSet) backend against a loopback Kubernetes API (tests/fixtures/k8s_double).

As in test_gke_backend.py, the real clients talk HTTP to kmock's emulator and the tests
play the JobSet controller and the kubelet by creating pods and patching ``/status``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.backends.k8s import slices as kslices
from airflow_provider_kinetic.core.backends.k8s import status as ks
from airflow_provider_kinetic.core.backends.k8s.jobset import JobSetBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import jobset_manifest
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.spec.failure import USER_ERROR_EXIT
from airflow_provider_kinetic.core.spec.handles import JobStatus
from tests.fixtures import records
from tests.fixtures.k8s_double import K8sDouble, to_json
from tests.integration.core.backends.k8s.test_gke_backend import (
    JOB_ID,
    NS,
    PODS,
    add_event,
    add_pod,
    ago,
    both,
    make_spec,
    worker,
)

JOBSET = f"kinetic-slices-{JOB_ID}"
JOBSET_PATH = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
HANDLE = records.handle(JOB_ID, "b", "jobset", namespace=NS, k8s_name=JOBSET)
RUNNING = {"phase": "Running", "containerStatuses": worker({"running": {}})}


def pod_name(slice_index: int, host: int, attempt: int = 0) -> str:
    return f"{JOBSET}-slice-{slice_index}-{host}-a{attempt}"


async def add_host(
    api: K8sDouble, slice_index: int, host: int, attempt: int = 0, **status: Any
) -> None:
    """A pod of slice ``slice_index``, host ``host``, labelled as JobSet and Job label them."""
    labels = {
        "jobset.sigs.k8s.io/job-index": str(slice_index),
        "batch.kubernetes.io/job-completion-index": str(host),
        kslices.RESTART_LABEL: str(attempt),
    }
    await add_pod(api, pod_name(slice_index, host, attempt), owner=JOBSET, labels=labels, **status)


async def add_jobset(api: K8sDouble, max_restarts: int = 0, **status: Any) -> None:
    spec = make_spec("tpu-v5p-2x2x2", num_slices=2, max_restarts=max_restarts)
    await api.create(JOBSET_PATH, to_json(jobset_manifest(spec)))
    if status:
        await api.patch_status(f"{JOBSET_PATH}/{JOBSET}", status)


def done(kind: str) -> dict[str, Any]:
    return {"conditions": [{"type": kind, "status": "True", "reason": "AllJobsCompleted"}]}


async def test_create_status_logs_cancel_of_two_slices_of_two_hosts(api: K8sDouble) -> None:
    spec = make_spec("tpu-v5p-2x2x2", num_slices=2)
    backend = JobSetBackend(api.client_factory())
    assert JobSetBackend.manifest(spec) == jobset_manifest(spec)  # the dry run is the submit
    assert (await both(backend, HANDLE)).status is JobStatus.NOT_FOUND
    await asyncio.to_thread(backend.submit, spec)
    (post,) = api.sent("POST")
    assert post.url.path == JOBSET_PATH
    assert json.loads(post.body)["spec"] == to_json(jobset_manifest(spec))["spec"]

    report = await both(backend, HANDLE)
    assert (report.status, report.message) == (JobStatus.PENDING, "waiting for the slices' pods")
    for s, h in [(0, 0), (0, 1), (1, 0)]:
        await add_host(api, s, h, **RUNNING)
    await add_host(api, 1, 1, phase="Pending")
    report = await both(backend, HANDLE)
    assert (report.status, report.message) == (JobStatus.PENDING, "slice 1 host 1 is starting")
    await api.patch_status(f"{PODS}/{pod_name(1, 1)}", RUNNING)
    assert (await both(backend, HANDLE)).status is JobStatus.RUNNING

    # The job's log is slice 0 host 0's; another host's tail is read by its job-wide index.
    for s in (0, 1):
        for h in (0, 1):
            api.write_log(NS, pod_name(s, h), f"slice {s} host {h}: step 1")
    assert await asyncio.to_thread(backend.read_logs, HANDLE, 0) == (
        "slice 0 host 0: step 1\n",
        1,
    )
    text = await asyncio.to_thread(backend.read_host_log, HANDLE, 2, 10)
    assert text == "slice 1 host 0: step 1\n"

    await api.patch_status(f"{JOBSET_PATH}/{JOBSET}", done("Completed"))
    assert (await both(backend, HANDLE)).status is JobStatus.SUCCEEDED

    await asyncio.to_thread(backend.cancel, HANDLE)
    (delete,) = api.sent("DELETE")
    assert delete.url.path == f"{JOBSET_PATH}/{JOBSET}"
    assert delete.params["propagationPolicy"] == "Foreground"
    assert (await both(backend, HANDLE)).status is JobStatus.NOT_FOUND
    await backend.acancel(HANDLE)  # 404: done


async def test_a_failed_host_in_slice_1_fails_the_job_naming_slice_1(api: K8sDouble) -> None:
    await add_jobset(api)
    for s, h in [(0, 0), (0, 1), (1, 1)]:
        await add_host(api, s, h, **RUNNING)
    crashed = worker({"terminated": {"exitCode": 1, "reason": "Error"}})
    await add_host(api, 1, 0, phase="Failed", containerStatuses=crashed)
    report = await both(JobSetBackend(api.client_factory()), HANDLE)
    assert report.status is JobStatus.FAILED
    assert report.message.startswith(f"slice 1 host 0 (pod {pod_name(1, 0)}): ")
    assert report.message.endswith("exited with code 1")


async def test_a_failure_within_the_restart_budget_restarts_the_gang(api: K8sDouble) -> None:
    """maxRestarts=1: the first failure is a restart (RUNNING, naming the host); the
    pods of the next attempt are the job's, the failed one of attempt 0 is history."""
    await add_jobset(api, max_restarts=1)
    backend = JobSetBackend(api.client_factory())
    await add_host(api, 0, 0, **RUNNING)
    killed = worker({"terminated": {"exitCode": 137, "reason": "Error"}})
    await add_host(api, 1, 0, phase="Failed", containerStatuses=killed)
    report = await both(backend, HANDLE)
    assert (report.status, report.reason) == (JobStatus.RUNNING, kslices.REASON_RESTARTING)
    assert report.message.startswith("restart 1 of at most 1 after slice 1 host 0")

    await api.patch_status(f"{JOBSET_PATH}/{JOBSET}", {"restarts": 1})
    for s in (0, 1):
        for h in (0, 1):
            await add_host(api, s, h, attempt=1, **RUNNING)
    assert (await both(backend, HANDLE)).status is JobStatus.RUNNING
    api.write_log(NS, pod_name(0, 0, 1), "attempt 2")
    assert await asyncio.to_thread(backend.read_logs, HANDLE, 0) == ("attempt 2\n", 1)
    # A second failure spends the budget: the job fails, naming the host.
    failed = {"phase": "Failed", "containerStatuses": killed}
    await api.patch_status(f"{PODS}/{pod_name(0, 1, 1)}", failed)
    report = await both(backend, HANDLE)
    assert report.status is JobStatus.FAILED and "slice 0 host 1" in report.message


async def test_a_user_error_fails_at_once_whatever_the_restart_budget(api: K8sDouble) -> None:
    """Exit USER_ERROR_EXIT: the JobSet's rule fails the gang, so the first read after it
    says FAILED (not a restart) even before the controller marks the JobSet."""
    await add_jobset(api, max_restarts=3)
    await add_host(api, 0, 0, **RUNNING)
    user_error = worker({"terminated": {"exitCode": USER_ERROR_EXIT, "reason": "Error"}})
    await add_host(api, 1, 1, phase="Failed", containerStatuses=user_error)
    report = await both(JobSetBackend(api.client_factory()), HANDLE)
    assert report.status is JobStatus.FAILED
    assert report.message.startswith("slice 1 host 1 (pod ")


async def test_a_slice_job_that_cannot_create_its_pods_fails_after_the_grace(
    api: K8sDouble,
) -> None:
    """No pods: slice 0's Job's FailedCreate event says why (the single read asks for
    that Job's events), PENDING within ``create_grace_s``, FAILED after it."""
    spec = make_spec("tpu-v5p-2x2x2", num_slices=2)
    body = to_json(jobset_manifest(spec))
    body["metadata"]["creationTimestamp"] = ago(600)
    await api.create(JOBSET_PATH, body)
    message = 'pods "x" is forbidden: error looking up service account default/kinetic'
    await add_event(api, f"{JOBSET}-slice-0", "Job", "FailedCreate", message)
    backend = JobSetBackend(api.client_factory())
    report = await both(backend, HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, ks.REASON_FAILED_CREATE)
    assert report.message == message
    backend.limits = ks.Limits(create_grace_s=3600)
    assert (await both(backend, HANDLE)).status is JobStatus.PENDING


async def test_a_waiting_slice_is_named_with_what_it_waits_for(api: K8sDouble) -> None:
    await add_jobset(api)
    for h in (0, 1):
        await add_host(api, 0, h, **RUNNING)
        unschedulable = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient google.com/tpu."}
        ]  # fmt: skip
        await add_host(api, 1, h, phase="Pending", conditions=unschedulable)
    report = await both(JobSetBackend(api.client_factory()), HANDLE)
    assert (report.status, report.reason) == (JobStatus.PENDING, ks.REASON_UNSCHEDULABLE)
    assert report.message.startswith("slice 1 host 0: ")


async def test_a_failed_jobset_without_a_failed_pod_reports_its_condition(
    api: K8sDouble,
) -> None:
    condition = {"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts",
                 "message": "jobset failed due to reaching max number of restarts"}  # fmt: skip
    failed = {"conditions": [condition]}
    await add_jobset(api, **failed)
    report = await both(JobSetBackend(api.client_factory()), HANDLE)
    assert (report.status, report.reason) == (JobStatus.FAILED, ks.REASON_JOB_FAILED)
    assert report.message.startswith("ReachedMaxRestarts: ")


def test_auto_picks_the_jobset_for_more_than_one_slice_only() -> None:
    v5p = parse_accelerator("tpu-v5p-2x2x4")
    assert registry.resolve_kind("auto", v5p, num_slices=4) == "jobset"
    assert registry.resolve_kind("auto", v5p) == "pathways"  # one multi-host slice
    assert registry.resolve_kind("jobset", v5p, num_slices=2) == "jobset"
    with pytest.raises(ValueError, match="num_slices=4 needs backend 'jobset' or 'auto'"):
        registry.resolve_kind("pathways", v5p, num_slices=4)
    with pytest.raises(ValueError, match="single-host slice"):
        registry.resolve_kind("auto", parse_accelerator("tpu-v5e-4"), num_slices=2)
    with pytest.raises(ValueError, match="the jobset backend runs multi-slice TPU jobs: .*gpu-l4"):
        registry.resolve_kind("jobset", parse_accelerator("gpu-l4"))
