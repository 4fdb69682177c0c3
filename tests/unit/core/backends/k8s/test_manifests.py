"""Every Job and LeaderWorkerSet the GKE backends can send, checked against real schemas.

Jobs go through ``kubernetes_validate`` (the Kubernetes 1.33 OpenAPI schema, strict:
unknown fields fail).  LeaderWorkerSets go through the LWS v0.5.1 CRD schema
(tests/fixtures/lws-crd-v0.5.1.yaml) with ``jsonschema``, made strict the way
``kubectl --validate=strict`` is, and their pod templates through
``kubernetes_validate`` as v1 PodTemplates.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from airflow_provider_kinetic.core.backends.k8s.manifests import (
    job_manifest,
    lws_manifest,
    to_yaml,
)
from airflow_provider_kinetic.core.catalog.accelerators import (
    GPU_TYPES,
    TPU_TYPES,
    parse_accelerator,
)
from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.spec.pod import JobSpec, SpecInputs, build_job_spec, label_value
from tests.fixtures.crd_schema import LWS_CRD, crd_validator

K8S_VERSION = "1.33"
JOB_ID = "job-0123abcd"
BUCKET = "proj-kn-c1-jobs"


def make_spec(accelerator: str, **extra: Any) -> JobSpec:
    return build_job_spec(
        SpecInputs(
            job_id=JOB_ID,
            bucket=BUCKET,
            context_uri=f"gs://{BUCKET}/{JOB_ID}/context.zip",
            payload_uri=f"gs://{BUCKET}/{JOB_ID}/payload.pkl",
            result_uri=f"gs://{BUCKET}/{JOB_ID}/result.pkl",
            payload_sha256="a" * 64,
            context_sha256="b" * 64,
            accelerator=parse_accelerator(accelerator),
            image="us-docker.pkg.dev/proj/kn-c1/base:tpu-0123456789ab",
            output_dir=f"gs://{BUCKET}/outputs/dag/run/task/",
            identity={"dag_id": "train", "task_id": "fit", "run_id": "manual__2026-01-01T00:00"},
            **extra,
        )
    )


# ---- the accelerator table ---------------------------------------------------------------

GPU_CASES = [f"gpu:{g.name}x{n}" for g in GPU_TYPES.values() for n in g.counts]
TPU_CASES = [f"tpu:{t.name}-{s.topology}" for t in TPU_TYPES.values() for s in t.slices.values()]
MULTI_HOST = [c for c in TPU_CASES if parse_accelerator(c).is_multi_host]
FUSE_DIR = FuseMount(f"gs://{BUCKET}/default/data-cache/abc123", "/data/train", is_dir=True)
FUSE_FILE = FuseMount(
    f"gs://{BUCKET}/default/data-cache/def456/labels.csv", "/data/labels.csv", is_dir=False
)
OTHER_BUCKET = FuseMount("gs://shared-datasets/imagenet", "/_kinetic/fuse-data/0", is_dir=True)

SPEC_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "cpu": ("cpu", {}),
    "cpu-requests": ("cpu:4", {"cpu_request": "4", "memory_request": "16Gi"}),
    **{c: (c, {}) for c in GPU_CASES + TPU_CASES},
    "gpu-spot": ("gpu:l4x2:spot", {}),
    "tpu-spot": ("tpu-v6e-2x4:spot", {}),
    "fuse-dir": ("gpu:l4", {"fuse": [FUSE_DIR]}),
    "fuse-file": ("tpu-v5litepod-2x2", {"fuse": [FUSE_FILE]}),
    "volumes": ("cpu", {"fuse": [FUSE_DIR, FUSE_FILE, OTHER_BUCKET], "env": {"HF_HOME": "/tmp"}}),
    "multi-host-fuse-spot": ("tpu-v6e-4x4:spot", {"fuse": [FUSE_DIR]}),
    # debug mode: the debugpy port declared, TTL 7200 s, its env (core/spec/debug.py)
    "debug": ("gpu:l4", {"debug_port": 5678, "debug_wait_s": 60.0}),
    "debug-multi-host": ("tpu-v6e-4x4", {"debug_port": 5679}),
}


def test_table_covers_every_catalog_entry() -> None:
    assert len(GPU_CASES) == sum(len(g.counts) for g in GPU_TYPES.values()) == 39
    assert len(TPU_CASES) == sum(len(t.slices) for t in TPU_TYPES.values()) == 58
    singles = [c for c in TPU_CASES if c not in MULTI_HOST]
    assert singles and MULTI_HOST  # both single- and multi-host topologies are exercised


@pytest.mark.parametrize("case", list(SPEC_CASES))
def test_job_manifest_is_a_valid_job(case: str) -> None:
    accelerator, extra = SPEC_CASES[case]
    manifest = job_manifest(make_spec(accelerator, **extra))
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == K8S_VERSION


@pytest.mark.parametrize(
    "case", [c for c, (a, _) in SPEC_CASES.items() if parse_accelerator(a).is_multi_host]
)
def test_lws_manifest_matches_crd_and_pod_schema(case: str, lws_validator: Any) -> None:
    accelerator, extra = SPEC_CASES[case]
    manifest = lws_manifest(make_spec(accelerator, **extra))
    lws_validator.validate(manifest)
    for key in ("leaderTemplate", "workerTemplate"):
        template = manifest["spec"]["leaderWorkerTemplate"][key]
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": template,
        }
        kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)


# ---- exact fields ----------------------------------------------------------------------


def test_job_shape_names_labels_and_policies() -> None:
    manifest = job_manifest(make_spec("gpu:a100x4"))
    meta, spec = manifest["metadata"], manifest["spec"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert meta["name"] == "kinetic-job-0123abcd"
    assert meta["labels"] == {
        "app": "kinetic",
        "job-id": JOB_ID,
        "airflow-dag-id": "train",
        "airflow-task-id": "fit",
        "airflow-run-id": label_value("manual__2026-01-01T00:00"),
    }
    assert meta["labels"]["airflow-run-id"].startswith("manual__2026-01-01T00-00-")
    assert spec["backoffLimit"] == 0
    assert spec["ttlSecondsAfterFinished"] == 600
    template = spec["template"]
    assert template["metadata"]["labels"] == {**meta["labels"], "job-name": meta["name"]}
    pod = template["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "kinetic"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}
    (container,) = pod["containers"]
    assert container["name"] == "kinetic-worker"
    assert container["command"] == ["python3", "-u", "/app/remote_runner.py"]
    assert container["args"][:2] == ["--context-gcs", f"gs://{BUCKET}/{JOB_ID}/context.zip"]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "4"},
        "requests": {"nvidia.com/gpu": "4"},
    }
    assert "annotations" not in template["metadata"]


def test_ttl_comes_from_the_spec() -> None:
    assert (
        job_manifest(make_spec("cpu", ttl_seconds=7200))["spec"]["ttlSecondsAfterFinished"] == 7200
    )


def test_cpu_job_requests_nothing_unless_asked() -> None:
    plain = job_manifest(make_spec("cpu"))["spec"]["template"]["spec"]
    assert "resources" not in plain["containers"][0]
    assert "nodeSelector" not in plain and "tolerations" not in plain
    sized = job_manifest(make_spec("cpu:4", cpu_request="4", memory_request="16Gi"))
    resources = sized["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "4", "memory": "16Gi"}}


def test_spot_toleration_has_value_true() -> None:
    pod = job_manifest(make_spec("gpu:l4x2:spot"))["spec"]["template"]["spec"]
    spot = [t for t in pod["tolerations"] if t["key"] == "cloud.google.com/gke-spot"]
    assert spot == [
        {
            "key": "cloud.google.com/gke-spot",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ]
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_tpu_v6e_2x4_is_two_hosts_of_four_chips() -> None:
    spec = make_spec("tpu-v6e-2x4")
    manifest = lws_manifest(spec)
    lwt = manifest["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    for key in ("leaderTemplate", "workerTemplate"):
        pod = lwt[key]["spec"]
        assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
        assert pod["containers"][0]["resources"]["requests"] == {"google.com/tpu": "4"}
        assert pod["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "2x4",
        }
    job_pod = job_manifest(spec)["spec"]["template"]["spec"]
    assert job_pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}


def test_lws_shape() -> None:
    spec = make_spec("tpu-v5litepod-4x4")
    before = copy.deepcopy(spec.container)
    manifest = lws_manifest(spec)
    assert manifest["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert manifest["kind"] == "LeaderWorkerSet"
    assert manifest["metadata"]["name"] == "keras-pathways-job-0123abcd"
    assert manifest["metadata"]["labels"]["app"] == "kinetic-pathways"
    assert manifest["metadata"]["labels"]["job-id"] == JOB_ID
    assert manifest["spec"]["replicas"] == 1
    lwt = manifest["spec"]["leaderWorkerTemplate"]
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lwt["size"] == 4
    assert lwt["leaderTemplate"] == lwt["workerTemplate"]
    assert lwt["leaderTemplate"] is not lwt["workerTemplate"]
    template = lwt["leaderTemplate"]
    assert "restartPolicy" not in template["spec"]
    assert template["metadata"]["labels"]["app"] == "kinetic-pathways"
    assert template["metadata"]["labels"]["job-name"] == "keras-pathways-job-0123abcd"
    env = {e["name"]: e["value"] for e in template["spec"]["containers"][0]["env"]}
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "$(LWS_LEADER_ADDRESS)"
    assert env["MEGASCALE_NUM_SLICES"] == "4"
    assert env["TPU_WORKER_ID"] == "$(LWS_WORKER_INDEX)"
    # A finished host idles (never exits: that would recreate the group and run the
    # function again) and reports completion through readiness.
    assert env["KINETIC_LWS"] == "1"
    probe = template["spec"]["containers"][0]["readinessProbe"]
    assert probe["exec"]["command"] == ["test", "-e", "/tmp/kinetic-finished"]
    assert env["JOB_ID"] == JOB_ID and env["JAX_PLATFORMS"] == "tpu"
    assert spec.container == before  # the shared spec is not edited
    assert lws_manifest(spec, "leaderworkerset.x-k8s.io/v1beta9")["apiVersion"].endswith("v1beta9")


def test_fuse_directory_volume_and_annotation() -> None:
    template = job_manifest(make_spec("gpu:l4", fuse=[FUSE_DIR]))["spec"]["template"]
    assert template["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    assert template["spec"]["volumes"] == [
        {
            "name": "gcs-fuse-0",
            "csi": {
                "driver": "gcsfuse.csi.storage.gke.io",
                "readOnly": True,
                "volumeAttributes": {
                    "bucketName": BUCKET,
                    "mountOptions": "implicit-dirs,only-dir=default/data-cache/abc123",
                },
            },
        }
    ]
    mounts = template["spec"]["containers"][0]["volumeMounts"]
    assert mounts == [{"name": "gcs-fuse-0", "mountPath": "/data/train", "readOnly": True}]


def test_fuse_single_file_mounts_its_parent_prefix() -> None:
    template = job_manifest(make_spec("cpu", fuse=[FUSE_FILE]))["spec"]["template"]
    (volume,) = template["spec"]["volumes"]
    attributes = volume["csi"]["volumeAttributes"]
    assert attributes == {
        "bucketName": BUCKET,
        "mountOptions": "implicit-dirs,only-dir=default/data-cache/def456",
    }


def test_several_volumes_are_numbered_in_order() -> None:
    pod = job_manifest(make_spec("cpu", fuse=[FUSE_DIR, FUSE_FILE, OTHER_BUCKET]))["spec"]
    volumes = pod["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["gcs-fuse-0", "gcs-fuse-1", "gcs-fuse-2"]
    assert volumes[2]["csi"]["volumeAttributes"] == {
        "bucketName": "shared-datasets",
        "mountOptions": "implicit-dirs,only-dir=imagenet",
    }
    paths = [m["mountPath"] for m in pod["template"]["spec"]["containers"][0]["volumeMounts"]]
    assert paths == ["/data/train", "/data/labels.csv", "/_kinetic/fuse-data/0"]


def test_yaml_round_trips() -> None:
    manifest = lws_manifest(make_spec("tpu-v6e-2x4", fuse=[FUSE_DIR]))
    text = to_yaml(manifest)
    assert text.startswith("apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n")
    assert yaml.safe_load(text) == manifest


# ---- the validators themselves must reject bad objects -------------------------------------


def test_job_validator_rejects_unknown_fields() -> None:
    manifest = job_manifest(make_spec("cpu"))
    manifest["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "restartPolicy"), "RecreateGroupOnPodRestart"),  # belongs in the template
        (("spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),
        (("spec", "leaderWorkerTemplate", "size"), "2"),
        (("spec", "replicas"), None),
    ],
)
def test_lws_validator_rejects_bad_objects(
    path: tuple[str, ...], value: Any, lws_validator: Any
) -> None:
    manifest = lws_manifest(make_spec("tpu-v6e-2x4"))
    target = manifest
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        lws_validator.validate(manifest)


# ---- the LWS CRD schema as a strict JSON-schema validator --------------------------------


@pytest.fixture(scope="module")
def lws_validator() -> Any:
    return crd_validator(LWS_CRD)


@pytest.fixture(scope="module", autouse=True)
def _cached_k8s_schemas() -> Any:
    """Parse each bundled schema file once per module (validate() re-reads ~3 MB a call)."""
    import functools

    import kubernetes_validate.utils as kv_utils

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_utils, "schema_contents", functools.lru_cache(kv_utils.schema_contents))
        yield


def test_secret_is_created_first_then_owned_by_the_job_and_removed_if_creation_fails():
    """The submit plan, driven by hand: no I/O, every call and its order checked."""
    from airflow_provider_kinetic.core.backends.k8s.api import Reply
    from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend, KubernetesApiError
    from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec

    spec = build_job_spec(
        SpecInputs(
            job_id="job-0000feed", bucket="b", context_uri="gs://b/c", payload_uri="gs://b/p",
            result_uri="gs://b/r", payload_sha256="0", context_sha256="0",
            accelerator=parse_accelerator("cpu"), image="i", output_dir="gs://b/o",
            namespace="ns", secrets={"KINETIC_RESULT_KEY": "ab" * 32},
        )
    )  # fmt: skip
    manifest = GkeBackend.manifest(spec)
    assert "ab" * 32 not in json.dumps(manifest)  # the value is never in the Job
    backend = GkeBackend(lambda: None)
    plan = backend._submit_plan(spec)
    secret_call = next(plan)
    assert secret_call.method == "create_namespaced_secret"
    assert secret_call.args[1]["stringData"] == {"KINETIC_RESULT_KEY": "ab" * 32}
    job_call = plan.send(Reply(201, b"{}"))
    assert job_call.method == "create_namespaced_job"
    created = {**manifest, "metadata": {**manifest["metadata"], "uid": "u-1"}}
    patch = plan.send(Reply(201, json.dumps(created).encode()))
    assert patch.method == "patch_namespaced_secret"
    (owner,) = patch.args[2]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", "kinetic-job-0000feed", "u-1")
    with pytest.raises(StopIteration):
        plan.send(Reply(200, b"{}"))
    # The Job cannot be created: its Secret is deleted again and the error names the Job.
    plan = backend._submit_plan(spec)
    next(plan)
    plan.send(Reply(201, b'{"metadata": {"uid": "s-1"}}'))
    delete = plan.send(Reply(403, b'{"message": "forbidden"}'))
    assert delete.method == "delete_namespaced_secret"
    assert delete.kwargs["body"]["preconditions"] == {"uid": "s-1"}  # only the one it made
    with pytest.raises(KubernetesApiError, match="creating Job ns/kinetic-job-0000feed: HTTP 403"):
        plan.send(Reply(200, b"{}"))
