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
import signal
import subprocess
import sys
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
from airflow_provider_kinetic.core.jobs.checkpoint import CHECKPOINT_URI_ENV, SYNC_S_ENV
from airflow_provider_kinetic.core.jobs.finish import failure_of
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.spec.failure import USER_ERROR_EXIT, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures import records
from tests.fixtures.k8s_double import K8sDouble, to_json
from tests.fixtures.waiting import wait_for
from tests.integration.runner.test_runner import REPO_ROOT, RUNNER_TIMEOUT_S, stage

NS = "default"
SLICES, HOSTS = 2, 2
SLICE_ENV = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
             "MEGASCALE_PORT", "TPU_WORKER_ID", "KINETIC_SLICE_HOSTS")  # fmt: skip
#: The job's own env the test kubelet passes on besides (checkpoints, for the restart).
JOB_ENV = (CHECKPOINT_URI_ENV, SYNC_S_ENV)
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


def submitted(
    store: LocalStore, tmp_path: Path, fail_in_slice: int | None, func: Any = None
) -> tuple[str, dict]:
    """The job staged in ``store`` and its JobSet manifest (args: the runner's flags;
    checkpoints under ``tmp_path/checkpoints``, synced every 0.2 s; one gang restart)."""
    (tmp_path / "seen").mkdir()
    args = (str(tmp_path / "seen"), fail_in_slice)
    request = JobRequest(func=func or train, args=args)
    flags = stage(store, request)
    value = dict(zip(flags[::2], flags[1::2], strict=True))
    spec = build_job_spec(
        SpecInputs(
            job_id=request.job_id, bucket=str(tmp_path / "bucket"), image="img", output_dir="file:///out",
            context_uri=value["--context-gcs"], payload_uri=value["--payload-gcs"],
            result_uri=value["--result-gcs"], payload_sha256=value["--payload-sha256"],
            context_sha256=value["--context-sha256"],
            accelerator=parse_accelerator("tpu-v5p-2x2x2"), num_slices=SLICES, max_restarts=1,
            env={CHECKPOINT_URI_ENV: f"file://{tmp_path}/checkpoints/slot", SYNC_S_ENV: "0.2"},
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
        if var["name"] not in SLICE_ENV + JOB_ENV:
            continue
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            path = re.sub(r"^metadata\.", "", var["valueFrom"]["fieldRef"]["fieldPath"])
            env[var["name"]] = fields[path]
    return env


def start_hosts(manifest: dict[str, Any]) -> dict[tuple[int, int], subprocess.Popen]:
    """Every host of every slice as a runner process, all at once (a test kubelet)."""
    (rjob,) = manifest["spec"]["replicatedJobs"]
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    drop = {*SLICE_ENV, *JOB_ENV, "LWS_WORKER_INDEX"}
    base = {k: v for k, v in os.environ.items() if k not in drop}
    command = [sys.executable, "-m", "airflow_provider_kinetic.runner", *container["args"]]
    procs = {}
    for where in [(s, h) for s in range(rjob["replicas"]) for h in range(HOSTS)]:
        env = {**base, "PYTHONPATH": str(REPO_ROOT), **host_env(container, *where)}
        procs[where] = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    return procs


def run_hosts(manifest: dict[str, Any]) -> dict[tuple[int, int], int]:
    """Every host run to its end: their exit codes."""
    procs = start_hosts(manifest)
    return {where: proc.wait(RUNNER_TIMEOUT_S) for where, proc in procs.items()}


async def kubelet_and_controller(
    api: K8sDouble,
    manifest: dict[str, Any],
    codes: dict[tuple[int, int], int | None],
    attempt: int = 0,
    restarted: bool = False,
) -> None:
    """The pods of restart ``attempt`` as the kubelet reports them (an exit code, None:
    running), the JobSet as its controller ends it (``restarted``: not yet, a failure
    the controller will restart the gang for)."""
    name = manifest["metadata"]["name"]
    for (s, h), code in codes.items():
        labels = {"job-name": name, JOB_INDEX_LABEL: str(s), COMPLETION_INDEX: str(h),
                  kslices.RESTART_LABEL: str(attempt)}  # fmt: skip
        pod = f"{name}-slice-{s}-{h}-a{attempt}"
        containers = [{"name": "kinetic-worker", "image": "i"}]
        await api.create(PODS, {"metadata": {"name": pod, "labels": labels},
                                "spec": {"containers": containers}})  # fmt: skip
        if code is None:
            state, phase = {"running": {}}, "Running"
        else:
            reason = "Completed" if code == 0 else "Error"
            state = {"terminated": {"exitCode": code, "reason": reason}}
            phase = "Succeeded" if code == 0 else "Failed"
        status = {"phase": phase, "containerStatuses": [{"name": "kinetic-worker", "state": state}]}
        await api.patch_status(f"{PODS}/{pod}", status)
    if restarted:
        return  # the status read sees the failure before the controller counts it
    if all(code == 0 for code in codes.values()):
        condition = {"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}
    else:  # a pod failure policy failed the Job, the JobSet's rule fails the gang
        assert USER_ERROR_EXIT in codes.values()
        condition = {"type": "Failed", "status": "True", "reason": "FailedJobs"}
    await api.patch_status(f"{JOBSETS}/{name}", {"restarts": attempt, "conditions": [condition]})


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


def train_resuming(seen_dir: str, fail_in_slice: int | None) -> str:
    """Each host notes its attempt and the step its checkpoint resumed from, saves
    step 5, and (attempt 1) trains on until it is killed."""
    import time

    where = f"{os.environ['MEGASCALE_SLICE_ID']}-{os.environ['TPU_WORKER_ID']}"
    attempt, ckpt = os.environ["KINETIC_ATTEMPT"], Path(os.environ["KINETIC_CHECKPOINT_DIR"])
    step = (ckpt / "step").read_text() if (ckpt / "step").exists() else "0"
    Path(seen_dir, f"{where}-a{attempt}").write_text(step)
    (ckpt / "step").write_text("5")
    if attempt == "1":
        end = time.monotonic() + 120  # the test kills it long before
        while time.monotonic() < end:
            time.sleep(0.05)  # timing-ok: the job's workload, held until the test kills it
        raise RuntimeError("attempt 1 was never stopped")
    return f"resumed from step {step} at attempt {attempt}"


async def test_killing_slice_1_host_0_restarts_the_whole_gang_once(api: K8sDouble, tmp_path):
    """SIGKILL of slice 1 host 0: the gang is restarted (the other hosts get SIGTERM as
    their pods go), every host runs again as attempt 2 from its checkpoint, and the
    function's value is delivered once, by slice 0 host 0."""
    store = LocalStore(str(tmp_path / "bucket"))
    job_id, manifest = submitted(store, tmp_path, None, func=train_resuming)
    await api.create(JOBSETS, to_json(manifest))
    name = manifest["metadata"]["name"]
    handle = records.handle(job_id, str(tmp_path / "bucket"), "jobset", namespace=NS,
                            k8s_name=name)  # fmt: skip
    backend = JobSetBackend(api.client_factory())
    procs = await asyncio.to_thread(start_hosts, manifest)
    slot = tmp_path / "checkpoints" / "slot"

    def synced() -> bool:  # every host's step 5 is in the store
        return len(list(slot.glob("host-*/files/*/step"))) >= SLICES * HOSTS

    def detail() -> str:
        return f"{sorted(str(p) for p in tmp_path.rglob('*'))} {[p.poll() for p in procs.values()]}"

    await asyncio.to_thread(wait_for, "every host's first checkpoint", synced, detail=detail)
    procs[(1, 0)].send_signal(signal.SIGKILL)  # its node went away
    assert procs[(1, 0)].wait(RUNNER_TIMEOUT_S) == -signal.SIGKILL
    now = {where: (137 if where == (1, 0) else None) for where in procs}  # None: running
    await kubelet_and_controller(api, manifest, now, restarted=True)
    report = await asyncio.to_thread(backend.status, handle)
    assert (report.status, report.reason) == (JobStatus.RUNNING, kslices.REASON_RESTARTING)
    assert report.message.startswith("restart 1 of at most 1 after slice 1 host 0 (pod ")
    for where, proc in procs.items():  # the JobSet restarts the gang: its pods go
        if where != (1, 0):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(RUNNER_TIMEOUT_S) == 143
    assert not store.exists(f"{job_id}/result.pkl")

    await api.patch_status(f"{JOBSETS}/{name}", {"restarts": 1})
    codes = await asyncio.to_thread(run_hosts, manifest)
    assert set(codes.values()) == {0}
    await kubelet_and_controller(api, manifest, codes, attempt=1)
    report = await asyncio.to_thread(backend.status, handle)
    assert report.status is JobStatus.SUCCEEDED
    assert collect(store, job_id, report.status) == "resumed from step 5 at attempt 2"
    seen = {p.name: p.read_text() for p in (tmp_path / "seen").iterdir()}
    hosts = [f"{s}-{h}" for s in range(SLICES) for h in range(HOSTS)]
    assert seen == {**{f"{w}-a1": "0" for w in hosts}, **{f"{w}-a2": "5" for w in hosts}}
    written = sorted(k.rsplit("/", 1)[-1] for k in store.list(f"{job_id}/result"))
    assert written == ["result.pkl"]  # one delivered result, by the leader
