"""The two registries: backends (``{kind: class}``) and Data schemes.

Everything that used to compare kind or scheme strings asks these; a new backend or
scheme is one class plus one registration, which the tests below do.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.pathways import PathwaysBackend
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.schemes import _SCHEMES as SCHEMES
from airflow_provider_kinetic.core.data.schemes import (
    DataScheme,
    register_scheme,
    scheme_for,
    scheme_names,
)
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.links import job_url
from tests.fixtures import records


def test_builtin_kinds_and_auto():
    assert registry.backend_kinds() == ("local", "gke", "pathways", "jobset", "auto")
    assert registry.backend_class("pathways") is PathwaysBackend
    assert [c.name for c in registry.auto_candidates()] == ["gke", "pathways"]


@pytest.mark.parametrize(
    ("configured", "accelerator", "kind"),
    [
        ("auto", "tpu-v6e-2x4", "pathways"),
        ("auto", "tpu-v5e-4", "gke"),
        ("auto", "gpu-l4", "gke"),
        ("pathways", "tpu-v5e-4", "pathways"),
        ("local", "tpu-v6e-2x4", "local"),
    ],
)
def test_kind_resolution_by_preflight(configured, accelerator, kind):
    assert registry.resolve_kind(configured, parse_accelerator(accelerator)) == kind


def test_preflight_refuses_before_anything_runs():
    with pytest.raises(ValueError, match=r"spans 2 hosts; a GKE Job runs one pod"):
        registry.resolve_kind("gke", parse_accelerator("tpu-v6e-2x4"))
    with pytest.raises(ValueError, match="unknown kinetic backend 'k8s'; allowed: local, gke"):
        registry.backend_class("k8s")


def test_console_urls_come_from_the_backend_class():
    gke = records.handle("job-1", "b", "gke", zone="z", cluster_name="c", project="p")
    assert job_url(gke.to_dict()) == GkeBackend.console_url(gke)
    assert "/kubernetes/job/z/c/default/kinetic-job-1/" in job_url(gke)
    lws = gke.evolve(backend="pathways")
    assert "/leaderworkerset/" in job_url(lws)
    # A JobSet: the page of the headless Service named like it, as xpk links one.
    slices = gke.evolve(backend="jobset", k8s_name="kinetic-slices-job-1")
    assert job_url(slices) == (
        "https://console.cloud.google.com/kubernetes/service/z/c/default/kinetic-slices-job-1"
        "/details?project=p"
    )
    assert job_url(records.handle("job-2", "/r")) == "/kinetic/jobs/job-2"  # no web console


class QueueBackend(LocalBackend):
    """A made-up kind: only CPU jobs, store under its own root, its own console."""

    name = "queue"

    @classmethod
    def preflight(cls, accelerator: Any, requested: Any = None) -> None:
        if accelerator.kind != "cpu":
            raise ValueError(f"the queue backend runs CPU jobs only, not {accelerator.canonical}")

    @classmethod
    def console_url(cls, handle: Any) -> str:
        return f"https://queue.example/{handle.job_id}"


@pytest.fixture
def queue_kind():
    registry.register_backend("queue", QueueBackend)
    yield QueueBackend
    registry._REGISTRY.pop("queue")


def test_a_new_backend_is_one_class_and_one_registration(queue_kind, tmp_path):
    config = KineticConfig(backend="queue", root=str(tmp_path))
    assert config.backend_kind(parse_accelerator("cpu")) == "queue"
    assert isinstance(config.store(), LocalStore) and config.bucket_name == str(tmp_path)
    with pytest.raises(ValueError, match="CPU jobs only, not gpu-l4x1"):
        config.backend_kind(parse_accelerator("gpu-l4"))
    assert job_url(records.handle("job-3", backend="queue")) == "https://queue.example/job-3"
    assert "queue" in registry.backend_kinds()
    from airflow_provider_kinetic import get_provider_info

    form = get_provider_info()["connection-types"][0]["conn-fields"]["backend"]
    assert "queue" in form["schema"]["enum"]


@pytest.mark.parametrize(
    ("path", "scheme", "uploads"),
    [
        ("./data", "local", True),
        ("/abs/data", "local", True),
        ("file:///abs/data", "file", True),
        ("gs://b/p/", "gs", False),
        ("hf://org/name?split=train", "hf", False),
    ],
)
def test_every_path_has_one_scheme(path, scheme, uploads):
    assert scheme_for(path).name == scheme
    assert Data(path).uploads is uploads


def test_unknown_scheme_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unsupported scheme 's3://'.*file://, gs://, hf://"):
        Data("s3://bucket/key").validate()


class S3Scheme(DataScheme):
    """What adding ``s3://`` would look like: pass-through by reference."""

    name = "s3"

    def validate(self, data: Data) -> None:
        if not data.path[len("s3://") :].split("/", 1)[0]:
            raise ValueError(f"Data URI {data.path!r} has no bucket")

    def is_dir(self, data: Data) -> bool:
        return data.path.endswith("/")

    def ref(self, data: Data, store: Any, mount: str | None) -> tuple[dict, None]:
        from airflow_provider_kinetic.core.data.schemes.base import plain_ref

        return plain_ref(data, data.path, self.is_dir(data), mount), None


@pytest.fixture
def s3_scheme():
    register_scheme(S3Scheme())
    yield
    SCHEMES.pop("s3")


def test_a_new_scheme_is_one_class_and_one_registration(s3_scheme, tmp_path):
    from airflow_provider_kinetic.core.jobs.pack import prepare
    from airflow_provider_kinetic.core.jobs.request import JobRequest

    assert "s3" in scheme_names()
    data = Data("s3://bucket/prefix/")
    data.validate()
    assert not data.uploads and data.is_dir
    with pytest.raises(ValueError, match="has no bucket"):
        Data("s3:///x").validate()
    packed = prepare(JobRequest(func=len, args=(data,)), LocalStore(str(tmp_path)), env_vars={})
    assert packed.local_data == []  # passed by reference: nothing to upload
    assert not os.listdir(tmp_path)


def test_output_dirs_travel_as_directory_uris():
    from airflow_provider_kinetic.operators.common import directory_uri

    assert directory_uri("gs://b/outputs/x") == "gs://b/outputs/x/"
    assert directory_uri("gs://b/outputs/x/") == "gs://b/outputs/x/"
    assert Data(directory_uri("gs://b/outputs/x")).is_dir
    assert directory_uri("file:///r/outputs/x") == "file:///r/outputs/x"
    assert directory_uri(None) is None


def test_gke_jobs_get_https_links_for_logs_and_outputs_local_jobs_do_not():
    from urllib.parse import unquote

    from airflow_provider_kinetic.links import batch_url, job_links

    gke = records.handle(
        "job-1", "b", "gke", zone="z", cluster_name="c1", project="p", namespace="ml",
        output_dir="gs://b/outputs/d/r/t/-1",
    )  # fmt: skip
    links = job_links(gke)
    assert set(links) == {"kinetic_job_link", "kinetic_logs_link", "kinetic_output_link"}
    assert all(url.startswith("https://console.cloud.google.com/") for url in links.values())
    logs = unquote(links["kinetic_logs_link"])
    assert 'resource.labels.cluster_name="c1"' in logs and 'labels."k8s-pod/job-id"="job-1"' in logs
    assert links["kinetic_output_link"].endswith("/storage/browser/b/outputs/d/r/t/-1/?project=p")
    group = GkeBackend.group_logs_url("grp-00000001", "p", "c1", "ml")
    assert 'labels."k8s-pod/kinetic-group-id"="grp-00000001"' in unquote(group)
    local = records.handle("job-2", "/r", output_dir="file:///r/outputs/x")
    assert job_links(local) == {"kinetic_job_link": "/kinetic/jobs/job-2"}  # the Kinetic page
    assert LocalBackend.group_logs_url("grp-1", "", "", "default") is None
    assert batch_url("local", "grp-1", "", "", "default") == "/kinetic/?group=grp-1"
    assert batch_url("gke", "grp-00000001", "p", "c1", "ml") == group
