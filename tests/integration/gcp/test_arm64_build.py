"""A bundled image for arm64 hosts (GB200) through the real Cloud Build client.

As in ``test_image_build.py``, ``gcp/image_build.py`` runs unmocked against the
loopback Cloud Build / Artifact Registry double and fake-gcs-server; here the build
request the double receives must say the arm64 platform, and the arm64 image must not
stand in for the amd64 one of the same content (nor the other way round).
"""

from __future__ import annotations

from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.runtime.images import plan_image
from airflow_provider_kinetic.gcp.image_build import (
    BINFMT_IMAGE,
    BUILDS_PREFIX,
    DOCKER_BUILDER,
)

# The same Cloud Build double, store and connection as the amd64 build tests.
from tests.integration.gcp.test_image_build import config, double, hook, store  # noqa: F401


def bundled(config: KineticConfig, accelerator: str, requirements: tuple = ("numpy>=1.26",)):  # noqa: F811
    return plan_image(
        container_image=None,
        requirements=list(requirements),
        entry_file=None,
        local=False,
        config=config,
        accelerator=parse_accelerator(accelerator),
    )


def test_arm64_build_request_says_the_platform(double, config, store):  # noqa: F811
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


def test_arm64_and_amd64_images_of_the_same_content_never_share_a_tag(double, config, store):  # noqa: F811
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
