"""Image plans (custom / prebuilt / bundled / local) and the published Dockerfiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
from airflow_provider_kinetic.core.runtime import wheel
from airflow_provider_kinetic.core.runtime.buildfiles import RUNNER_SHIM, build_context
from airflow_provider_kinetic.core.runtime.images import (
    CATEGORIES,
    PUBLISHED_PYTHON,
    ImageConfigError,
    plan_image,
    render_dockerfile,
)

DOCKER = Path(__file__).parents[4] / "docker"


def gke(**extra) -> KineticConfig:
    base = {"backend": "gke", "bucket": "bkt", "project": "proj", "zone": "europe-west4-a",
            "cluster": "c1"}  # fmt: skip
    return KineticConfig(**{**base, **extra})


def plan(config: KineticConfig, container_image=None, requirements=None, category="cpu", **kw):
    return plan_image(container_image=container_image, requirements=requirements,
                      entry_file=None, category=category, local=kw.get("local", False),
                      config=config)  # fmt: skip


@pytest.mark.parametrize("category", CATEGORIES)
def test_docker_folder_is_what_the_generator_writes(category):
    """docker/ is regenerated with ``python -m airflow_provider_kinetic.core.runtime.images
    docker/``; the same renderer makes the bundled Dockerfile."""
    text = (DOCKER / f"Dockerfile.{category}").read_text()
    assert text == render_dockerfile(category, PUBLISHED_PYTHON, with_requirements=False)
    assert (DOCKER / "remote_runner.py").read_text() == RUNNER_SHIM
    bundled = render_dockerfile(category, PUBLISHED_PYTHON, with_requirements=True)
    assert bundled.startswith(text.split("COPY remote_runner.py")[0])


def test_custom_uri_is_used_as_is_and_image_is_its_older_spelling():
    assert plan(gke(), "eu.gcr.io/p/runner:7").uri == "eu.gcr.io/p/runner:7"
    legacy = plan(gke(image="eu.gcr.io/p/old:1"))
    assert (legacy.mode, legacy.uri) == ("custom", "eu.gcr.io/p/old:1")
    assert plan(gke(container_image="eu.gcr.io/p/new:2")).uri == "eu.gcr.io/p/new:2"
    # discovered requirements are not installed into a custom image; explicit ones are
    assert not plan(gke(image="x/y:1")).needs_requirements_upload
    assert plan(gke(image="x/y:1"), requirements=["six"]).needs_requirements_upload


def test_prebuilt_names_the_category_image_and_uploads_requirements():
    p = plan(gke(base_image_repo="us-docker.pkg.dev/p/kinetic/"), "prebuilt", ["six"], "tpu")
    assert p.uri == f"us-docker.pkg.dev/p/kinetic/base-tpu:{wheel.package_version()}"
    assert p.needs_requirements_upload and p.requirements.lines == ["six"]
    with pytest.raises(ImageConfigError, match="needs the connection's 'base_image_repo'"):
        plan(gke(), "prebuilt")


def test_bundled_is_the_default_on_a_cluster_and_derives_its_repository():
    p = plan(gke(), requirements=["numpy"], category="gpu")
    assert p.mode == "bundled" and not p.needs_requirements_upload
    assert p.uri == f"europe-west4-docker.pkg.dev/proj/kn-c1/base:{p.tag}"
    assert p.tag.startswith("gpu-") and len(p.tag) == 16
    assert p.registry.tag_name(p.tag).endswith(f"/repositories/kn-c1/packages/base/tags/{p.tag}")
    explicit = plan(gke(artifact_registry_location="us", artifact_registry_repository="imgs"))
    assert explicit.uri.startswith("us-docker.pkg.dev/proj/imgs/base:cpu-")
    ctx = build_context(p)
    assert ctx["requirements.txt"] == b"numpy\n" and "jax[cuda12]" in ctx["Dockerfile"].decode()
    # the tag moves with the Python minor version (part of the base image)
    other = plan_image(container_image=None, requirements=["numpy"], entry_file=None,
                       category="gpu", local=False, config=gke(), python="3.99")  # fmt: skip
    assert other.tag != p.tag and "ARG PYTHON_VERSION=3.99" in other.dockerfile


def test_local_backend_ignores_images():
    p = plan(KineticConfig(backend="local", root="/tmp"), "prebuilt", ["./local-pkg"], local=True)
    assert (p.mode, p.uri, p.requirements.lines) == ("local", None, ["./local-pkg"])


def test_bad_settings_fail_before_anything_happens():
    with pytest.raises(ImageConfigError, match=r"container_image='has space'.*'prebuilt'"):
        KineticRunOperator(task_id="t", python_callable=print, container_image="has space")
    with pytest.raises(ValueError, match=r"requirements: 3 \(int\) is not allowed"):
        KineticRunOperator(task_id="t", python_callable=print, requirements=["six", 3])
    with pytest.raises(ImageConfigError, match="container_image='bundeld'"):
        gke(container_image="bundeld")
    with pytest.raises(KineticConfigError, match="both image="):
        gke(image="a/b:1", container_image="c/d:2")
    with pytest.raises(ImageConfigError, match="needs a GCP project"):
        plan(gke(project=None, endpoint={"host": "https://x"}))
