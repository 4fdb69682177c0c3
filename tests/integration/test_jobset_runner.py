"""A 2-slice x 2-host job end to end: the JobSet manifest against the Kubernetes API
double, its hosts as real runner processes started by a test kubelet from the
manifest's own container (args and env, ``fieldRef`` values resolved as the kubelet
does), the JobSet controller's outcome played from their exit codes.

Each host sees its slice id and the megascale environment; only slice 0 host 0 writes
the result, which the task's read returns; a user error in slice 1 exits
``USER_ERROR_EXIT`` (the JobSet's rule fails the gang) and the failure names slice 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_provider_kinetic.core.backends.k8s import slices as kslices
from airflow_provider_kinetic.core.backends.k8s.jobset import JobSetBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import (
    COMPLETION_INDEX,
    JOB_INDEX_LABEL,
    jobset_manifest,
)
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.jobs.finish import failure_of
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.spec.failure import USER_ERROR_EXIT, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures import records
from tests.fixtures.k8s_double import K8sDouble, to_json
from tests.integration.test_runner import REPO_ROOT, RUNNER_TIMEOUT_S, stage

NS = "default"
SLICES, HOSTS = 2, 2
SLICE_ENV = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
             "MEGASCALE_PORT", "TPU_WORKER_ID", "KINETIC_SLICE_HOSTS")  # fmt: skip
JOBSETS = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
PODS = f"/api/v1/namespaces/{NS}/pods"


def train(seen_dir: str, fail_in_slice: int | None) -> str:
    """Each host notes the megascale environment it sees; one slice may fail."""
    env = {name: os.environ.get(name) for name in SLICE_ENV}
    host = f"{env['MEGASCALE_SLICE_ID']}-{env['TPU_WORKER_ID']}"
    Path(seen_dir, host).write_text(json.dumps(env))
    if env["MEGASCALE_SLICE_ID"] == str(fail_in_slice) and env["TPU_WORKER_ID"] == "0":
        raise ValueError("bad shard in this slice")
    return f"trained on {env['MEGASCALE_NUM_SLICES']} slices"


def submitted(store: LocalStore, tmp_path: Path, fail_in_slice: int | None) -> tuple[str, dict]:
    """The job staged in ``store`` and its JobSet manifest (args: the runner's flags)."""
    (tmp_path / "seen").mkdir()
    request = JobRequest(func=train, args=(str(tmp_path / "seen"), fail_in_slice))
    flags = stage(store, request)
    value = dict(zip(flags[::2], flags[1::2], strict=True))
    spec = build_job_spec(
        SpecInputs(
            job_id=request.job_id, bucket=str(tmp_path / "bucket"), image="img", output_dir="file:///out",
            context_uri=value["--context-gcs"], payload_uri=value["--payload-gcs"],
            result_uri=value["--result-gcs"], payload_sha256=value["--payload-sha256"],
            context_sha256=value["--context-sha256"],
            accelerator=parse_accelerator("tpu-v5p-2x2x2"), num_slices=SLICES,
        )
    )  # fmt: skip
    assert spec.args == flags
    return request.job_id, jobset_manifest(spec)


def host_env(container: dict[str, Any], slice_index: int, host: int) -> dict[str, str]:
    """The container's slice environment as the kubelet gives it to one pod."""
    fields = {f"labels['{JOB_INDEX_LABEL}']": str(slice_index),
              f"annotations['{COMPLETION_INDEX}']": str(host)}  # fmt: skip
    env = {}
    for var in container["env"]:
        if var["name"] not in SLICE_ENV:
            continue
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            path = re.sub(r"^metadata\.", "", var["valueFrom"]["fieldRef"]["fieldPath"])
            env[var["name"]] = fields[path]
    return env


def run_hosts(manifest: dict[str, Any]) -> dict[tuple[int, int], int]:
    """Every host of every slice as a runner process, all at once: their exit codes."""
    (rjob,) = manifest["spec"]["replicatedJobs"]
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    base = {k: v for k, v in os.environ.items() if k not in SLICE_ENV and k != "LWS_WORKER_INDEX"}

    def one(where: tuple[int, int]) -> int:
        env = {**base, "PYTHONPATH": str(REPO_ROOT), **host_env(container, *where)}
        command = [sys.executable, "-m", "airflow_provider_kinetic.runner", *container["args"]]
        done = subprocess.run(command, env=env, capture_output=True, timeout=RUNNER_TIMEOUT_S)
        return done.returncode

    hosts = [(s, h) for s in range(rjob["replicas"]) for h in range(HOSTS)]
    with ThreadPoolExecutor(len(hosts)) as pool:
        return dict(zip(hosts, pool.map(one, hosts), strict=True))


async def kubelet_and_controller(
    api: K8sDouble, manifest: dict[str, Any], codes: dict[tuple[int, int], int]
) -> None:
    """The pods as the kubelet reports them, the JobSet as its controller ends it."""
    name = manifest["metadata"]["name"]
    for (s, h), code in codes.items():
        labels = {"job-name": name, JOB_INDEX_LABEL: str(s), COMPLETION_INDEX: str(h),
                  kslices.RESTART_LABEL: "0"}  # fmt: skip
        pod = f"{name}-slice-{s}-{h}"
        containers = [{"name": "kinetic-worker", "image": "i"}]
        await api.create(PODS, {"metadata": {"name": pod, "labels": labels},
                                "spec": {"containers": containers}})  # fmt: skip
        state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
        status = {"phase": "Succeeded" if code == 0 else "Failed",
                  "containerStatuses": [{"name": "kinetic-worker", "state": state}]}  # fmt: skip
        await api.patch_status(f"{PODS}/{pod}", status)
    if all(code == 0 for code in codes.values()):
        condition = {"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}
    else:  # a pod failure policy failed the Job, the JobSet's rule fails the gang
        assert USER_ERROR_EXIT in codes.values()
        condition = {"type": "Failed", "status": "True", "reason": "FailedJobs"}
    await api.patch_status(f"{JOBSETS}/{name}", {"conditions": [condition]})


async def test_two_slices_of_two_hosts_run_and_the_leader_delivers(api: K8sDouble, tmp_path):
    store = LocalStore(str(tmp_path / "bucket"))
    job_id, manifest = submitted(store, tmp_path, fail_in_slice=None)
    await api.create(JOBSETS, to_json(manifest))
    codes = await asyncio.to_thread(run_hosts, manifest)
    assert codes == {(s, h): 0 for s in range(SLICES) for h in range(HOSTS)}
    seen = {p.name: json.loads(p.read_text()) for p in (tmp_path / "seen").iterdir()}
    coordinator = f"{manifest['metadata']['name']}-slice-0-0.{manifest['metadata']['name']}"
    for s in range(SLICES):
        for h in range(HOSTS):
            assert seen[f"{s}-{h}"] == {
                "MEGASCALE_COORDINATOR_ADDRESS": coordinator, "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": str(s), "MEGASCALE_PORT": "8080",
                "TPU_WORKER_ID": str(h), "KINETIC_SLICE_HOSTS": "2",
            }  # fmt: skip
    # Only the leader wrote a result (workers that succeed write nothing).
    written = sorted(k.rsplit("/", 1)[-1] for k in store.list(f"{job_id}/result"))
    assert written == ["result.pkl"]

    await kubelet_and_controller(api, manifest, codes)
    handle = records.handle(job_id, str(tmp_path / "bucket"), "jobset", namespace=NS,
                            k8s_name=manifest["metadata"]["name"])  # fmt: skip
    report = await asyncio.to_thread(JobSetBackend(api.client_factory()).status, handle)
    assert report.status is JobStatus.SUCCEEDED
    assert collect(store, job_id, report.status) == "trained on 2 slices"


async def test_a_user_error_in_slice_1_fails_the_gang_naming_slice_1(api: K8sDouble, tmp_path):
    store = LocalStore(str(tmp_path / "bucket"))
    job_id, manifest = submitted(store, tmp_path, fail_in_slice=1)
    await api.create(JOBSETS, to_json(manifest))
    codes = await asyncio.to_thread(run_hosts, manifest)
    assert codes[(1, 0)] == USER_ERROR_EXIT and codes[(0, 0)] == 0
    await kubelet_and_controller(api, manifest, codes)
    handle = records.handle(job_id, str(tmp_path / "bucket"), "jobset", namespace=NS,
                            k8s_name=manifest["metadata"]["name"])  # fmt: skip
    report = await asyncio.to_thread(JobSetBackend(api.client_factory()).status, handle)
    assert report.status is JobStatus.FAILED
    assert report.message.startswith("slice 1 host 0 (pod ")
    failure = failure_of(store, handle, report, None)
    assert failure is not None and failure.failure_class is FailureClass.USER_ERROR
    assert "on slice 1 host 0 (2 slices of 2 hosts)" in failure.describe()
    assert "ValueError: bad shard in this slice" in failure.describe()
