"""KineticRunOperator.dry_run(): the manifest, printed as YAML, nothing uploaded or created."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml

from airflow_provider_kinetic import Data, KineticRunOperator
from tests.fixtures.crd_schema import JOBSET_CRD, crd_validator
from tests.fixtures.local_conn import set_conn


def train(data: str) -> int:
    return len(data)


@pytest.fixture
def gke_conn(monkeypatch, tmp_path):
    # Any GCS call would go to a closed port and fail, and there is no GCP connection
    # for a cluster lookup: a dry run that passes contacted neither.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", raising=False)
    extras = {
        "backend": "auto",
        "bucket": "proj-kn-c1-jobs",
        "project": "proj",
        "zone": "us-central2-b",
        "cluster": "c1",
        "image": "us-docker.pkg.dev/p/r/base:tpu",
    }
    set_conn(monkeypatch, "kinetic_dry", extras)
    return extras


@pytest.mark.parametrize(
    ("accelerator", "kind", "tpu"),
    [("tpu-v5e-4", "Job", "4"), ("tpu-v6e-2x4", "LeaderWorkerSet", "4"), ("gpu-l4x2", "Job", None)],
)
def test_dry_run_manifest_without_credentials(gke_conn, tmp_path, capsys, accelerator, kind, tpu):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.csv").write_text("1,2\n")
    op = KineticRunOperator(
        task_id="train",
        python_callable=train,
        accelerator=accelerator,
        op_kwargs={"data": Data(str(tmp_path / "d"), fuse=True)},
        kinetic_conn_id="kinetic_dry",
    )
    manifest = op.dry_run()
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == manifest and manifest["kind"] == kind
    if kind == "Job":
        kubernetes_validate.validate(manifest, "1.33", strict=True)
        pod = manifest["spec"]["template"]["spec"]
    else:
        pod = manifest["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == gke_conn["image"]
    # The context is content-addressed: shared by every job with the same content.
    assert container["args"][0] == "--context-gcs"
    sha = container["args"][container["args"].index("--context-sha256") + 1]
    assert container["args"][1] == f"gs://proj-kn-c1-jobs/default/context-cache/{sha}.zip"
    limits = container["resources"]["limits"]
    assert limits.get("google.com/tpu") == tpu
    # FUSE data (a local dir, content-addressed) mounts its cache prefix read-only.
    volume = pod["volumes"][0]["csi"]["volumeAttributes"]
    assert volume["bucketName"] == "proj-kn-c1-jobs"
    assert volume["mountOptions"].startswith("implicit-dirs,only-dir=default/data-cache/")


def test_dry_run_rejects_multi_host_on_gke(monkeypatch):
    extras = {"backend": "gke", "bucket": "bkt-1", "project": "p", "zone": "z", "cluster": "c"}
    set_conn(monkeypatch, "kinetic_gke", extras)
    op = KineticRunOperator(
        task_id="t", python_callable=train, accelerator="tpu-v6e-2x4", kinetic_conn_id="kinetic_gke"
    )
    with pytest.raises(ValueError, match="'tpu-v6e-2x4'.*spans 2 hosts.*'pathways' or 'auto'"):
        op.dry_run()


def test_map_operator_dry_run_shows_a_child(gke_conn, capsys):
    from airflow_provider_kinetic import KineticMapOperator

    op = KineticMapOperator(
        task_id="sweep",
        python_callable=train,
        inputs=["a", "bb"],
        accelerator="gpu-l4",
        kinetic_conn_id="kinetic_dry",
    )
    manifest = op.dry_run()
    assert yaml.safe_load(capsys.readouterr().out) == manifest
    kubernetes_validate.validate(manifest, "1.33", strict=True)
    labels = manifest["metadata"]["labels"]
    assert labels["kinetic-group-index"] == "0" and labels["kinetic-group-id"].startswith("grp-")
    env = {
        e["name"]: e.get("value")
        for e in manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["KINETIC_GROUP_INDEX"] == "0" and env["KINETIC_OUTPUT_DIR"].endswith("/sweep/-1/0")


def test_dry_run_shows_secret_references_never_values(gke_conn, monkeypatch):
    monkeypatch.setenv("KN_DRY_PASSWORD", "hunter2-dry-run")
    op = KineticRunOperator(
        task_id="train",
        python_callable=train,
        op_args=["x"],
        capture_env_vars=["KN_DRY_PASSWORD"],
        kinetic_conn_id="kinetic_dry",
    )
    manifest = op.dry_run()
    assert "hunter2-dry-run" not in json.dumps(manifest)
    env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in env
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "KN_DRY_PASSWORD": "kinetic-job-dryrun00-secrets",
        "KINETIC_RESULT_KEY": "kinetic-job-dryrun00-secrets",
        "KINETIC_PEER_TOKEN": "kinetic-job-dryrun00-secrets",
    }


@pytest.mark.parametrize(
    "capacity", ["on-demand", "spot", "reservation:r1", "queue:team-a", "class:tpu-first"]
)
def test_dry_run_of_four_v5p_slices_is_a_valid_jobset(gke_conn, capsys, capacity):
    """Each capacity kind GKE offers a multi-host v5p slice (flex-start: through a queue)."""
    op = KineticRunOperator(
        task_id="train",
        python_callable=train,
        op_kwargs={"data": "x"},
        accelerator="tpu-v5p-2x2x4",
        num_slices=4,
        capacity=capacity,
        kinetic_conn_id="kinetic_dry",
    )
    manifest = op.dry_run()
    assert yaml.safe_load(capsys.readouterr().out) == manifest
    crd_validator(JOBSET_CRD).validate(manifest)
    (rjob,) = manifest["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 4 and rjob["template"]["spec"]["parallelism"] == 4
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "s"}, **rjob["template"]}
    job["metadata"] = {"name": "s", **rjob["template"]["metadata"]}
    kubernetes_validate.validate(job, "1.33", strict=True)
    pod = rjob["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MEGASCALE_NUM_SLICES"] == "4"
    assert pod["nodeSelector"].get("cloud.google.com/gke-tpu-topology", "2x2x4") == "2x2x4"
