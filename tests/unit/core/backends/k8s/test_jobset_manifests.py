"""Multi-slice TPU jobs as JobSets, checked against the JobSet CRD's own schema.

The JobSet goes through the JobSet v0.12.0 CRD schema (tests/fixtures/jobset-crd-v0.12.0.yaml,
strict, ``tests/fixtures/crd_schema.py``); its child Job, pod template included, through
``kubernetes_validate`` (the Kubernetes OpenAPI schema, strict).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from airflow_provider_kinetic.core.backends.k8s.manifests import (
    EXCLUSIVE_TOPOLOGY,
    job_manifest,
    jobset_manifest,
)
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.catalog.capacity import chain_for, supported_kinds
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.runner.invocation import host_index
from tests.fixtures.crd_schema import JOBSET_CRD, crd_validator
from tests.unit.core.backends.k8s.test_manifests import FUSE_DIR, K8S_VERSION, make_spec

NAMES = {"reservation": "reservation:r1", "queue": "queue:team-a", "class": "class:tpu-x"}
#: Every kind GKE offers a multi-host v5p slice (flex-start: through Kueue, ``queue:``).
CAPACITIES = [NAMES.get(k, k) for k in supported_kinds(parse_accelerator("tpu-v5p-2x2x4"))]


@pytest.fixture(scope="module")
def jobset_validator() -> Any:
    return crd_validator(JOBSET_CRD)


def spec_of(accelerator: str, capacity: str | None = None, **extra: Any) -> JobSpec:
    step = chain_for(capacity, accelerator)[0] if capacity else None
    return make_spec(accelerator, capacity=step, **extra)


def child_job(manifest: dict[str, Any]) -> dict[str, Any]:
    (rjob,) = manifest["spec"]["replicatedJobs"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "slice", **rjob["template"]["metadata"]},
        "spec": rjob["template"]["spec"],
    }


def env_of(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = child_job(manifest)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_capacity_kinds_are_every_one_gke_offers_multi_host() -> None:
    assert CAPACITIES == ["on-demand", "spot", "reservation:r1", "queue:team-a", "class:tpu-x"]


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_v5p_2x2x4_times_4_is_a_valid_jobset_for_every_capacity_kind(
    capacity: str, jobset_validator: Any
) -> None:
    accelerator = "tpu-v5p-2x2x4:spot" if capacity == "spot" else "tpu-v5p-2x2x4"
    spec = spec_of(accelerator, capacity, num_slices=4, fuse=[FUSE_DIR], priority_class="low")
    manifest = jobset_manifest(spec)
    jobset_validator.validate(manifest)
    assert kubernetes_validate.validate(child_job(manifest), K8S_VERSION, strict=True)
    # The same node selector, tolerations, capacity fields and mounts as one slice's Job.
    single = job_manifest(spec)["spec"]["template"]["spec"]
    pod = child_job(manifest)["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "volumes", "priorityClassName"):
        assert pod.get(key) == single.get(key)
    assert pod["containers"][0]["volumeMounts"] == single["containers"][0]["volumeMounts"]
    # The owner's capacity fields (Kueue's queue label, suspend) sit on the JobSet.
    job = job_manifest(spec)
    assert manifest["metadata"]["labels"] == job["metadata"]["labels"]
    assert manifest["spec"].get("suspend") == job["spec"].get("suspend")


def test_one_job_per_slice_each_of_the_slices_hosts() -> None:
    manifest = jobset_manifest(spec_of("tpu-v5p-2x2x4", num_slices=4, max_restarts=3))
    assert manifest["kind"] == "JobSet"
    assert manifest["metadata"]["name"] == "kinetic-slices-job-0123abcd"
    assert (
        manifest["metadata"]["annotations"][EXCLUSIVE_TOPOLOGY] == "cloud.google.com/gke-nodepool"
    )
    (rjob,) = manifest["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (rjob["name"], rjob["replicas"]) == ("slice", 4)
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (4, 4, "Indexed")
    # One failure policy: any failure restarts the gang (3 times at most), but a user
    # error (its host exits USER_ERROR_EXIT) fails the Job and then the whole JobSet.
    assert job["backoffLimit"] == 0 and manifest["spec"]["failurePolicy"] == {
        "maxRestarts": 3,
        "rules": [
            {
                "name": "userError",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "kinetic-worker", "operator": "In", "values": [86]},
    }
    resources = job["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"google.com/tpu": "4"}  # 16 chips over 4 hosts
    env = env_of(manifest)
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == (
        "kinetic-slices-job-0123abcd-slice-0-0.kinetic-slices-job-0123abcd"
    )
    assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_PORT"]) == ("4", "8080")
    assert env["MEGASCALE_SLICE_ID"] == {
        "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}
    }
    assert env["TPU_WORKER_ID"] == {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    assert env["KINETIC_SLICE_HOSTS"] == "4" and "KINETIC_LWS" not in env


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "replicatedJobs", 0, "replicas"), "4"),
        (("spec", "failurePolicy", "restartStrategy"), "Sometimes"),
        (("spec", "failurePolicy", "retries"), 1),
        (("spec", "replicatedJobs", 0, "name"), None),
        (("spec", "network", "enableDNSHostnames"), "yes"),
    ],
)
def test_the_jobset_validator_rejects_bad_objects(
    path: tuple[Any, ...], value: Any, jobset_validator: Any
) -> None:
    manifest = copy.deepcopy(jobset_manifest(spec_of("tpu-v6e-4x4", num_slices=2)))
    jobset_validator.validate(manifest)
    target = manifest
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jobset_validator.validate(manifest)


@pytest.mark.parametrize(
    ("env", "index"),
    [
        ({"TPU_WORKER_ID": "1"}, 1),  # one slice: the worker id
        ({"TPU_WORKER_ID": "0", "MEGASCALE_SLICE_ID": "0", "KINETIC_SLICE_HOSTS": "2"}, 0),
        ({"TPU_WORKER_ID": "0", "MEGASCALE_SLICE_ID": "1", "KINETIC_SLICE_HOSTS": "2"}, 2),
        ({"TPU_WORKER_ID": "1", "MEGASCALE_SLICE_ID": "3", "KINETIC_SLICE_HOSTS": "4"}, 13),
    ],
)
def test_only_slice_0_host_0_is_the_jobs_host_0(
    env: dict[str, str], index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TPU_WORKER_ID", "LWS_WORKER_INDEX", "MEGASCALE_SLICE_ID", "KINETIC_SLICE_HOSTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert host_index() == index
