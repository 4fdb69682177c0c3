"""Connection extras -> KineticConfig, as the UI or the CLI would store them."""

from __future__ import annotations

import os

import pytest

from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.deployment.connection import config_from_json
from airflow_provider_kinetic.hooks.kinetic import (
    KineticHook,
    config_from_extras,
    config_to_json,
)
from tests.fixtures.local_conn import set_conn


def test_ui_strings_are_typed():
    config = config_from_extras(
        {
            "extra__kinetic__backend": "auto",
            "bucket": "kn-jobs",
            "project": "p",
            "zone": "z",
            "cluster": "c",
            "image_pull_grace_s": "30",
            "use_internal_ip": "true",
            "endpoint": '{"host": "https://10.0.0.1", "ca_data": null}',
            "runner_command": "python3 -u /app/remote_runner.py",
        }
    )
    assert config.backend == "auto" and config.image_pull_grace_s == 30.0
    assert config.use_internal_ip is True and config.endpoint["host"] == "https://10.0.0.1"
    assert config.runner_command == ["python3", "-u", "/app/remote_runner.py"]
    assert config.bucket_name == "kn-jobs"
    assert config_from_json(config_to_json(config)) == config
    assert config.backend_kind(parse_accelerator("tpu-v6e-2x4")) == "pathways"
    assert config.backend_kind(parse_accelerator("gpu-l4")) == "gke"


def test_bucket_defaults_to_kinetic_naming():
    config = config_from_extras({"backend": "gke", "project": "proj", "cluster": "kc"})
    assert config.bucket_name == "proj-kn-kc-jobs"


def test_bad_extras_are_named():
    with pytest.raises(ValueError, match="'image_pull_grace_s' must be a number, got 'soon'"):
        config_from_extras({"backend": "gke", "image_pull_grace_s": "soon"})
    with pytest.raises(ValueError, match="unknown kinetic backend 'k8s'"):
        config_from_extras({"backend": "k8s"})


def test_missing_default_connection_falls_back_to_local(monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_DEFAULT", raising=False)
    monkeypatch.delenv("AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    config = KineticHook().get_config()
    assert config.backend == "local" and config.bucket_name == str(tmp_path / "kinetic")


def test_missing_named_connection_is_an_error(monkeypatch):
    from airflow.providers.common.compat.sdk import AirflowNotFoundException

    with pytest.raises(AirflowNotFoundException, match="'kinetic_nowhere' does not exist"):
        KineticHook("kinetic_nowhere").get_config()


def test_named_connection(monkeypatch, tmp_path):
    hook = KineticHook(set_conn(monkeypatch, "kinetic_x", {"root": str(tmp_path / "r")}))
    assert hook.get_store().uri("a") == f"file://{tmp_path}/r/a"
    ok, message = hook.test_connection()
    assert ok and f"store file://{tmp_path}/r works" in message
    assert os.listdir(tmp_path / "r") == []  # the probe object is gone


def test_job_ttl_is_configurable_and_reaches_the_manifest():
    from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest
    from airflow_provider_kinetic.core.storage import GcsStore
    from tests.fixtures import records

    extras = {"backend": "gke", "bucket": "kn-jobs", "project": "p", "zone": "z", "cluster": "c"}
    config = config_from_extras({**extras, "ttl_seconds_after_finished": "120"})
    assert config.ttl_seconds_after_finished == 120
    spec = records.template("gke").spec(config, GcsStore("kn-jobs"), "job-0000cafe")
    assert job_manifest(spec)["spec"]["ttlSecondsAfterFinished"] == 120
    with pytest.raises(ValueError, match="ttl_seconds_after_finished' must be a whole number"):
        config_from_extras({**extras, "ttl_seconds_after_finished": "-5"})
