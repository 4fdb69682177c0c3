"""Bundled images through the real Artifact Registry and Cloud Build clients.

``hooks/image_build.py`` runs unmocked: providers-google's ``CloudBuildHook`` and the
``google-cloud-artifact-registry`` client talk REST to the loopback double
(``tests/fixtures/cloudbuild_double.py``), and the build context goes through the
real GCS store into fake-gcs-server, from where the double reads it back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.runtime import wheel
from airflow_provider_kinetic.core.runtime.images import ImagePlan, plan_image
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from airflow_provider_kinetic.hooks.image_build import (
    BUILDS_PREFIX,
    DOCKER_BUILDER,
    ENDPOINT_ENV,
    ImageBuildError,
    ImageBuildHook,
)
from tests.fixtures.cloudbuild_double import CloudBuildDouble, cloudbuild_double


@pytest.fixture
def store(fake_gcs, gcs_bucket: str) -> GcsStore:
    return GcsStore(gcs_bucket, client=fake_gcs.client())


@pytest.fixture
def double(store: GcsStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudBuildDouble]:
    def read_source(bucket: str, key: str) -> bytes:
        assert bucket == store.bucket
        return store.read_bytes(key)

    # CloudBuildHook reads the connection's gcp_conn_id, as in production.
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    with cloudbuild_double(read_source) as d:
        monkeypatch.setenv(ENDPOINT_ENV, d.endpoint)
        yield d


@pytest.fixture
def config(gcs_bucket: str) -> KineticConfig:
    return KineticConfig(
        backend="gke", bucket=gcs_bucket, project="proj", zone="us-central1-a", cluster="c1"
    )


def bundled(config: KineticConfig, tmp_path: Path, category: str = "cpu") -> ImagePlan:
    (tmp_path / "requirements.txt").write_text("numpy>=1.26\njax==0.4.30\n")
    (tmp_path / "dag.py").write_text("")
    return plan_image(
        container_image=None, requirements=None, entry_file=str(tmp_path / "dag.py"),
        category=category, local=False, config=config,
    )  # fmt: skip


def hook(config: KineticConfig) -> ImageBuildHook:
    # The double advances one state per read: no waiting between polls.
    return ImageBuildHook(config, poll_interval=0.0, sleep=lambda _s: None)


def test_cache_hit_builds_nothing(double, config, store, tmp_path):
    plan = bundled(config, tmp_path)
    double.add_tag(plan.uri)
    assert hook(config).ensure(plan, store) is False
    assert double.builds == []
    assert [m for m, _ in double.requests] == ["GET"]  # one get_tag, nothing else
    assert store.list(BUILDS_PREFIX + "/") == []


class Lines(logging.Handler):
    """The hook's log lines (Airflow's logging setup may route records elsewhere)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_miss_submits_one_build_with_the_docker_step_and_tag(double, config, store, tmp_path):
    plan = bundled(config, tmp_path)
    assert plan.uri == f"us-central1-docker.pkg.dev/proj/kn-c1/base:{plan.tag}"
    logger = logging.getLogger("airflow_provider_kinetic.hooks.image_build")
    lines, level = Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        assert hook(config).ensure(plan, store) is True
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    [build] = double.builds
    assert [(s.name, list(s.args)) for s in build.steps] == [
        (DOCKER_BUILDER, ["build", "--network=cloudbuild", "-t", plan.uri, "."])
    ]
    assert list(build.images) == [plan.uri]
    assert build.timeout.total_seconds() == 1200
    assert build.options.logging.name == "CLOUD_LOGGING_ONLY"
    assert build.source.storage_source.bucket == store.bucket
    files = double.sources[build.id]
    assert files["Dockerfile"].decode() == plan.dockerfile
    assert files["requirements.txt"] == b"numpy>=1.26\n"  # jax dropped: the image has it
    assert f"dist/{wheel.wheel_name()}" in files
    assert b"airflow_provider_kinetic.runner" in files["remote_runner.py"]
    # The status lines reach the log; the context is gone; the tag now exists.
    assert any(ln.startswith("Cloud Build build-0001: WORKING") for ln in lines.lines)
    assert any(ln.startswith("Cloud Build build-0001: SUCCESS") for ln in lines.lines)
    assert store.list(BUILDS_PREFIX + "/") == []
    assert hook(config).exists(plan)
    assert hook(config).ensure(plan, store) is False and len(double.builds) == 1


def test_failed_build_is_a_clear_error_with_the_log_url(double, config, store, tmp_path):
    plan = bundled(config, tmp_path, "gpu")
    double.outcome = "failure"
    with pytest.raises(ImageBuildError, match="ended FAILURE") as err:
        hook(config).ensure(plan, store)
    [build] = double.builds
    assert err.value.log_url == build.log_url and build.log_url in str(err.value)
    assert plan.uri in str(err.value)
    assert not hook(config).exists(plan)
    assert store.list(BUILDS_PREFIX + "/") == []


def test_categories_get_distinct_tags_and_equal_inputs_the_same(config, tmp_path):
    plans = {c: bundled(config, tmp_path, c) for c in ("cpu", "gpu", "tpu")}
    assert len({p.uri for p in plans.values()}) == 3
    assert all(p.tag.startswith(f"{c}-") and len(p.tag) == len(c) + 13 for c, p in plans.items())
    assert bundled(config, tmp_path, "cpu").uri == plans["cpu"].uri
    (tmp_path / "requirements.txt").write_text("numpy>=2\n")
    changed = plan_image(container_image=None, requirements=None,
                         entry_file=str(tmp_path / "dag.py"), category="cpu", local=False,
                         config=config)  # fmt: skip
    assert changed.tag != plans["cpu"].tag


def _dry_conn(monkeypatch: pytest.MonkeyPatch, gcs_bucket: str) -> str:
    extras = {"backend": "gke", "bucket": gcs_bucket, "project": "proj", "cluster": "c1",
              "zone": "us-central1-a", "endpoint": {"host": "https://x"}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_KN_DRY", json.dumps({"conn_type": "kinetic", "extra": extras}))
    return "kn_dry"


def _square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("operator", ["run", "map"])
def test_dry_run_shows_the_image_and_whether_it_would_be_built(
    double, monkeypatch, gcs_bucket, capsys, operator
):
    import yaml

    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator

    conn = _dry_conn(monkeypatch, gcs_bucket)
    common = {"task_id": "t", "python_callable": _square, "kinetic_conn_id": conn,
              "requirements": ["six"]}  # fmt: skip
    if operator == "run":
        op = KineticRunOperator(op_args=[3], **common)
    else:
        op = KineticMapOperator(inputs=[1, 2], **common)
    manifest = op.dry_run()
    out = capsys.readouterr().out
    uri = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
    assert f"# image: bundled image {uri} (1 requirement(s))" in out
    assert "# image status: would be built with Cloud Build" in out
    assert yaml.safe_load(out) == manifest  # the report lines are YAML comments
    double.add_tag(uri)
    op.dry_run()
    assert "# image status: exists" in capsys.readouterr().out
    assert double.builds == []  # a dry run never builds
