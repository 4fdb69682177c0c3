"""A prebuilt-image job on GKE: ``submit_job`` uploads ``{job_id}/requirements.txt`` and the
Job's runner gets ``--requirements-gcs`` (the Kubernetes API double receives the Job;
fake-gcs-server holds the store)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.runtime import wheel
from airflow_provider_kinetic.core.runtime.requirements import RequirementsError
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from tests.fixtures.k8s_double import threaded_double

REPO = "us-docker.pkg.dev/proj/kinetic"


def double_it(x: int) -> int:
    return 2 * x


@pytest.fixture
def config(gcs_bucket: str) -> KineticConfig:
    return KineticConfig(backend="gke", bucket=gcs_bucket, project="proj", zone="us-central1-a",
                         cluster="c1", container_image="prebuilt", base_image_repo=REPO,
                         endpoint={"host": "https://unused"})  # fmt: skip


def test_prebuilt_job_uploads_its_requirements_and_passes_the_flag(fake_gcs, config):
    store = GcsStore(config.bucket, client=fake_gcs.client())
    request = JobRequest(func=double_it, args=(4,), requirements=["six==1.16", "jaxlib"])
    with threaded_double() as api:
        handle, spec = submit_job(request, config, GkeBackend(api.double.client_factory()), store)
        (post,) = api.sent("POST", "/jobs")
    container = json.loads(post.body)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{REPO}/base-cpu:{wheel.package_version()}"
    key = artifact_key(handle.job_id, "requirements.txt")
    args = container["args"]
    assert args[args.index("--requirements-gcs") + 1] == store.uri(key)
    assert store.read_bytes(key) == b"six==1.16\n"  # jaxlib: the image's own JAX
    assert handle.image_uri == container["image"]


def test_a_local_path_fails_before_anything_is_uploaded(fake_gcs, config):
    store = GcsStore(config.bucket, client=fake_gcs.client())
    request = JobRequest(func=double_it, args=(4,), requirements=["numpy", "-e ./mylib"])
    with threaded_double() as api:
        with pytest.raises(RequirementsError, match=r"'-e \./mylib'.*relative path"):
            submit_job(request, config, GkeBackend(api.double.client_factory()), store)
        assert api.sent("POST") == []
    assert store.list("") == []


def test_a_prebuilt_batch_uploads_its_requirements_once_for_every_child(fake_gcs, config):
    from airflow_provider_kinetic.core.batch import launch as batchlaunch
    from airflow_provider_kinetic.core.batch.plan import plan_batch

    store = GcsStore(config.bucket, client=fake_gcs.client())
    request = JobRequest(func=double_it, requirements=["six==1.16"])
    state, objects, _ = plan_batch(request, [1, 2], "auto", store, config=config,
                                   max_concurrent=2, retries=0, fail_fast=False)  # fmt: skip
    [key] = [k for k in objects if k.endswith("requirements.txt")]
    assert objects[key] == b"six==1.16\n"
    for index in (0, 1):
        spec = batchlaunch.child_spec(state, index, f"job-0000000{index}", config, store, None)
        assert spec.args[spec.args.index("--requirements-gcs") + 1] == store.uri(key)


def test_a_multi_slice_job_is_submitted_as_a_jobset_under_auto(fake_gcs, config):
    """``num_slices=2`` through the real submit: ``auto`` resolves to the jobset backend,
    the API double receives the JobSet, the handle names it and carries the slices."""
    from dataclasses import replace

    from airflow_provider_kinetic.core.backends.k8s.jobset import JobSetBackend
    from airflow_provider_kinetic.core.jobs.options import JobOptions

    auto = replace(config, backend="auto")
    store = GcsStore(auto.bucket, client=fake_gcs.client())
    options = JobOptions(accelerator="tpu-v5p-2x2x2", num_slices=2, max_restarts=3)
    request = JobRequest(func=double_it, args=(4,), requirements=[], options=options)
    with threaded_double() as api:
        handle, spec = submit_job(request, auto, JobSetBackend(api.double.client_factory()), store)
        (post,) = api.sent("POST", "/jobsets")
    body = json.loads(post.body)
    assert (handle.backend, handle.num_slices) == ("jobset", 2)
    assert handle.k8s_name == body["metadata"]["name"] == f"kinetic-slices-{handle.job_id}"
    assert body["spec"]["replicatedJobs"][0]["replicas"] == 2
    assert body["spec"]["failurePolicy"]["maxRestarts"] == 3
    pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"
