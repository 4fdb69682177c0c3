"""A bundled image for arm64 hosts (GB200) through the real Cloud Build client.

As in ``test_image_build.py``, ``hooks/image_build.py`` runs unmocked against the
loopback Cloud Build / Artifact Registry double and fake-gcs-server; here the build
request the double receives must say the arm64 platform, and the arm64 image must not
stand in for the amd64 one of the same content (nor the other way round).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from airflow_provider_kinetic.core.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.runtime.images import plan_image
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from airflow_provider_kinetic.hooks.image_build import (
    BINFMT_IMAGE,
    BUILDS_PREFIX,
    DOCKER_BUILDER,
    ENDPOINT_ENV,
    ImageBuildHook,
)
from tests.fixtures.cloudbuild_double import CloudBuildDouble, cloudbuild_double


@pytest.fixture
def store(fake_gcs, gcs_bucket: str) -> GcsStore:
    return GcsStore(gcs_bucket, client=fake_gcs.client())


@pytest.fixture
def double(store: GcsStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudBuildDouble]:
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))

    def read_source(bucket: str, key: str) -> bytes:
        assert bucket == store.bucket
        return store.read_bytes(key)

    def write_object(bucket: str, key: str, data: bytes) -> None:
        assert bucket == store.bucket
        store.write_bytes(key, data, content_type="text/plain")

    with cloudbuild_double(read_source, write_object) as d:
        monkeypatch.setenv(ENDPOINT_ENV, d.endpoint)
        yield d


@pytest.fixture
def config(gcs_bucket: str) -> KineticConfig:
    return KineticConfig(
        backend="gke", bucket=gcs_bucket, project="proj", zone="us-central1-a", cluster="c1"
    )


def bundled(config: KineticConfig, accelerator: str, requirements: tuple = ("numpy>=1.26",)):
    return plan_image(
        container_image=None,
        requirements=list(requirements),
        entry_file=None,
        local=False,
        config=config,
        accelerator=parse_accelerator(accelerator),
    )


def hook(config: KineticConfig) -> ImageBuildHook:
    return ImageBuildHook(config, poll_interval=0.0, sleep=lambda _s: None)


def test_arm64_build_request_says_the_platform(double, config, store):
    arm = bundled(config, "gpu-gb200x4")
    assert hook(config).ensure(arm, store) is True
    [build] = double.builds
    assert [(s.name, list(s.args)) for s in build.steps] == [
        (DOCKER_BUILDER, ["run", "--privileged", "--rm", BINFMT_IMAGE, "--install", "arm64"]),
        (DOCKER_BUILDER,
         ["build", "--platform", "linux/arm64", "--network=cloudbuild", "-t", arm.uri, "."]),
    ]  # fmt: skip
    assert list(build.images) == [arm.uri]
    assert list(build.tags) == ["kinetic", "kinetic-gpu", "kinetic-arm64"]
    assert double.sources[build.id]["Dockerfile"].decode() == arm.dockerfile
    assert hook(config).exists(arm)
    assert store.list(BUILDS_PREFIX + "/") == []


def test_arm64_and_amd64_images_of_the_same_content_never_share_a_tag(double, config, store):
    arm, amd = bundled(config, "gpu-gb200x4"), bundled(config, "gpu-b200x8")
    assert arm.dockerfile == amd.dockerfile and arm.uri != amd.uri
    double.add_tag(amd.uri)  # the amd64 image exists: it does not count for arm64
    assert hook(config).exists(amd) and not hook(config).exists(arm)
    assert hook(config).ensure(amd, store) is False and double.builds == []
    assert hook(config).ensure(arm, store) is True
    [build] = double.builds
    assert "--platform" in build.steps[-1].args and list(build.images) == [arm.uri]
    # And the amd64 build of another content stays one plain step.
    other = bundled(config, "gpu-l4", ("six",))
    assert hook(config).ensure(other, store) is True
    assert [list(s.args) for s in double.builds[-1].steps] == [
        ["build", "--network=cloudbuild", "-t", other.uri, "."]
    ]
    assert "kinetic-amd64" in list(double.builds[-1].tags)
