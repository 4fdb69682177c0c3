"""The arm64 rule: an accelerator whose hosts are Arm (GB200) gets an arm64 image.

A bundled image is built for ``linux/arm64`` under its own tag; a prebuilt or custom
image is used as is with a note saying it needs an arm64 variant; a category whose JAX
has no arm64 build fails in the plan, before anything is uploaded.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest

from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.runtime.images import ImageConfigError, plan_image
from airflow_provider_kinetic.gcp.image_build import BINFMT_IMAGE, build_steps, prepare_image

GB200 = parse_accelerator("gpu-gb200x4")


def gke(**extra: str) -> KineticConfig:
    base = {"backend": "gke", "bucket": "bkt", "project": "proj", "zone": "us-central1-a",
            "cluster": "c1"}  # fmt: skip
    return KineticConfig(**{**base, **extra})


def plan(accelerator=None, container_image=None, config=None, **kw):
    return plan_image(container_image=container_image, requirements=["numpy"], entry_file=None,
                      local=kw.pop("local", False), config=config or gke(),
                      accelerator=accelerator, **kw)  # fmt: skip


def test_bundled_image_for_arm_hosts_is_built_for_arm64_under_its_own_tag() -> None:
    arm = plan(GB200)
    amd = plan(parse_accelerator("gpu-h200x8"))
    assert (arm.mode, arm.arch, arm.platform) == ("bundled", "arm64", "linux/arm64")
    assert (amd.arch, amd.platform) == ("amd64", "linux/amd64")
    # Same content (category, requirements, Dockerfile), different platform: never one tag.
    assert arm.dockerfile == amd.dockerfile and arm.requirements == amd.requirements
    assert re.fullmatch(r"gpu-arm64-[0-9a-f]{12}", arm.tag)
    assert re.fullmatch(r"gpu-[0-9a-f]{12}", amd.tag)
    assert arm.tag.rsplit("-", 1)[1] != amd.tag.rsplit("-", 1)[1]
    assert arm.uri == f"us-central1-docker.pkg.dev/proj/kn-c1/base:{arm.tag}"
    # An amd64 accelerator's tag is the one a category alone gives (tags made before
    # the arm64 rule still name the same images).
    assert amd.tag == plan(category="gpu").tag
    assert "built for linux/arm64" in arm.describe()
    assert "linux/" not in amd.describe() and arm.platform_note is None


@pytest.mark.parametrize(
    ("setting", "mode"),
    [("prebuilt", "prebuilt"), ("us-docker.pkg.dev/p/r/runner:1", "custom")],
)
def test_prebuilt_or_custom_image_is_used_as_is_with_a_note(setting: str, mode: str) -> None:
    p = plan(GB200, setting, gke(base_image_repo="us-docker.pkg.dev/p/kinetic"))
    assert (p.mode, p.arch) == (mode, "arm64")
    assert p.uri == plan(parse_accelerator("gpu-l4"), setting,
                         gke(base_image_repo="us-docker.pkg.dev/p/kinetic")).uri  # fmt: skip
    note = p.platform_note
    assert note is not None
    for fragment in ("'gpu-gb200x4'", "arm64 hosts", "linux/arm64 variant", "'bundled'"):
        assert fragment in note
    assert note in p.describe()  # what the dry run and the task log print
    amd = plan(parse_accelerator("gpu-l4"), setting, gke(base_image_repo="us-docker.pkg.dev/p/k"))
    assert amd.platform_note is None and "arm64" not in amd.describe()


def test_local_backend_runs_on_this_machine_whatever_the_hosts() -> None:
    p = plan(GB200, local=True, config=KineticConfig(backend="local", root="/tmp"))
    assert (p.mode, p.uri, p.platform_note) == ("local", None, None)


@pytest.mark.parametrize("setting", [None, "prebuilt", "us-docker.pkg.dev/p/r/runner:1"])
def test_an_architecture_the_category_cannot_have_fails_in_the_plan(setting) -> None:
    # No TPU host is Arm today; were one, libtpu (x86-64 wheels only) could not run on it.
    arm_tpu = dataclasses.replace(parse_accelerator("tpu-v6e-8"), arch="arm64")
    with pytest.raises(ImageConfigError) as info:
        plan(arm_tpu, setting, gke(base_image_repo="us-docker.pkg.dev/p/kinetic"))
    message = str(info.value)
    for fragment in ("'tpu-v6e-2x4'", "arm64 hosts", "allowed host architectures for tpu: amd64"):
        assert fragment in message


def test_plan_needs_an_accelerator_or_a_category() -> None:
    with pytest.raises(TypeError, match="accelerator or a category"):
        plan()
    assert plan(category="tpu").category == "tpu"


def test_build_steps_name_the_platform() -> None:
    arm, amd = plan(GB200), plan(parse_accelerator("gpu-b200x8"))
    assert build_steps(amd) == [["build", "--network=cloudbuild", "-t", amd.uri, "."]]
    assert build_steps(arm) == [
        ["run", "--privileged", "--rm", BINFMT_IMAGE, "--install", "arm64"],
        ["build", "--platform", "linux/arm64", "--network=cloudbuild", "-t", arm.uri, "."],
    ]


class Untouchable:
    """A store that fails the test if anything is read, written or listed."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the store was used ({name}) for an image that needs no build")


def test_prepare_logs_the_note_and_uploads_nothing(caplog: pytest.LogCaptureFixture) -> None:
    p = plan(GB200, "prebuilt", gke(base_image_repo="us-docker.pkg.dev/p/kinetic"))
    logger = "airflow_provider_kinetic.gcp.image_build"
    with caplog.at_level(logging.WARNING, logger=logger):
        assert prepare_image(p, gke(), Untouchable()) is p  # type: ignore[arg-type]
    [record] = [r for r in caplog.records if r.name == logger]
    assert record.levelno == logging.WARNING and p.platform_note in record.getMessage()
