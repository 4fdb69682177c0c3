"""ONE builder for the container and pod every backend runs.

The GKE backend wraps :class:`JobSpec` in a batch/v1 Job, Pathways in a
LeaderWorkerSet, and the local backend executes the very same command, args and
env as a process.  Manifests are plain Kubernetes-shaped dicts (camelCase), which
the kubernetes client accepts as request bodies and ``kubernetes-validate`` checks.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.catalog.capacity import Capacity, CapacityFields, pod_fields
from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.spec import debug as debug_mode

#: kinetic image layout: the runner script sits at this path in the image.
KINETIC_RUNNER_COMMAND = ["python3", "-u", "/app/remote_runner.py"]
CONTAINER_NAME = "kinetic-worker"
FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
DEFAULT_TTL_SECONDS = 600

_LABEL_VALUE_RE = re.compile(r"[^A-Za-z0-9_.-]")
#: Kubernetes label value syntax (empty is valid too, but never made here).
_LABEL_VALID_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


def label_value(value: Any) -> str:
    """``value`` as a Kubernetes label value (at most 63 characters of ``[A-Za-z0-9_.-]``,
    alphanumeric at both ends), distinct values giving distinct labels: a valid value is
    kept as it is; any other is its readable form plus ``-`` and 10 hex digits of its
    SHA-256 (so ``exp:1`` and ``exp+1``, or two all-CJK ids, never share a label)."""
    text = str(value)
    if len(text) <= 63 and _LABEL_VALID_RE.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    readable = _LABEL_VALUE_RE.sub("-", text).strip("-_.")[:52].rstrip("-_.")
    return f"{readable}-{digest}" if readable else digest


@dataclass
class SpecInputs:
    """Everything the builder needs; collected by ``JobTemplate.spec`` (a field a job
    option feeds is named by that option's ``pod`` metadata, ``core.jobs.options``)."""

    job_id: str
    bucket: str
    context_uri: str
    payload_uri: str
    result_uri: str
    payload_sha256: str
    context_sha256: str
    accelerator: Accelerator
    image: str
    output_dir: str
    namespace: str = "default"
    service_account: str = "kinetic"
    runner_command: list[str] = field(default_factory=lambda: list(KINETIC_RUNNER_COMMAND))
    env: dict[str, str] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)
    extra_labels: dict[str, str] = field(default_factory=dict)
    fuse: list[FuseMount] = field(default_factory=list)
    cpu_request: str | None = None
    memory_request: str | None = None
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    #: Env vars whose values are secret: delivered as a Kubernetes Secret (GKE) or a
    #: 0600 file (local), never written into a manifest, spec file, store or log.
    secrets: dict[str, str] = field(default_factory=dict)
    #: Requirements the runner installs before the call (prebuilt images).
    requirements_uri: str | None = None
    #: The capacity step the pod asks for (``core.capacity``); None: on-demand.
    capacity: Capacity | None = None
    #: Kueue WorkloadPriorityClass (``queue:`` steps) and flex-start's run limit.
    priority_class: str | None = None
    max_run_duration_s: float | None = None
    #: Identical TPU slices that run the job together (``core.catalog.multislice``).
    num_slices: int = 1
    #: A multi-slice job's whole-gang restarts (JobSet ``failurePolicy.maxRestarts``).
    max_restarts: int = 0
    #: Debug mode (``core.spec.debug``): the debugpy port (None: off) and its wait.
    debug_port: int | None = None
    debug_wait_s: float = debug_mode.DEFAULT_DEBUG_WAIT_S


def secret_name(job_id: str) -> str:
    """The Kubernetes Secret holding a job's secret env (owned by its Job/LWS)."""
    return f"kinetic-{job_id}-secrets"


@dataclass
class JobSpec:
    """The container + pod of one job, independent of the wrapper object."""

    job_id: str
    name: str
    namespace: str
    labels: dict[str, str]
    container: dict[str, Any]
    pod: dict[str, Any]
    accelerator: Accelerator
    fuse: list[FuseMount]
    ttl_seconds: int
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    #: Requirement lines of the task: the local backend runs the job in a venv built
    #: from them (``backends.local_venv``); pods get them through their image.
    requirements: list[str] = field(default_factory=list)
    #: Id of the signing secret the job's result key came from (its handle keeps it).
    result_key_id: str | None = None
    #: What the capacity step adds to the owning Job / LeaderWorkerSet (Kueue's queue
    #: label, ``suspend``); the pod's own capacity fields are already in ``pod``.
    capacity: CapacityFields = field(default_factory=CapacityFields)
    #: Identical TPU slices that run the job together (more than one: a JobSet), and
    #: how often the JobSet restarts the whole gang after a failure.
    num_slices: int = 1
    max_restarts: int = 0
    #: Debug mode's port (None: not a debug job; ``core.spec.debug``).
    debug_port: int | None = None

    @property
    def command(self) -> list[str]:
        return list(self.container["command"])

    @property
    def args(self) -> list[str]:
        return list(self.container["args"])

    @property
    def env(self) -> dict[str, str]:
        return {e["name"]: e["value"] for e in self.container.get("env", []) if "value" in e}

    def pod_template(self, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A PodTemplateSpec dict (metadata + spec) with the given extra labels."""
        meta: dict[str, Any] = {"labels": {**self.labels, **(labels or {})}}
        if self.pod.get("annotations"):
            meta["annotations"] = dict(self.pod["annotations"])
        spec = {k: v for k, v in self.pod.items() if k != "annotations"}
        spec["containers"] = [self.container]
        return {"metadata": meta, "spec": spec}


def identity_labels(identity: dict[str, Any]) -> dict[str, str]:
    """Airflow identity (dag/task/run/map index/try) as label-safe values."""
    keys = {
        "dag_id": "airflow-dag-id",
        "task_id": "airflow-task-id",
        "run_id": "airflow-run-id",
        "map_index": "airflow-map-index",
        "try_number": "airflow-try-number",
    }
    return {
        label: label_value(identity[key])
        for key, label in keys.items()
        # map_index -1 (not mapped) has no label: "-1" is not a valid label value.
        if identity.get(key) is not None and not (key == "map_index" and identity[key] == -1)
    }


def _resources(inp: SpecInputs) -> dict[str, Any]:
    limits = inp.accelerator.resource_limits()
    if limits:
        return {"limits": dict(limits), "requests": dict(limits)}
    requests = {}
    if inp.cpu_request:
        requests["cpu"] = str(inp.cpu_request)
    if inp.memory_request:
        requests["memory"] = str(inp.memory_request)
    return {"requests": requests} if requests else {}


def build_job_spec(inp: SpecInputs) -> JobSpec:
    """Build the container and pod for ``inp`` (no network, no side effects)."""
    args = [
        "--context-gcs",
        inp.context_uri,
        "--payload-gcs",
        inp.payload_uri,
        "--result-gcs",
        inp.result_uri,
        *(["--requirements-gcs", inp.requirements_uri] if inp.requirements_uri else []),
        "--payload-sha256",
        inp.payload_sha256,
        "--context-sha256",
        inp.context_sha256,
    ]
    env = {
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": inp.accelerator.jax_platform,
        "JOB_ID": inp.job_id,
        "GCS_BUCKET": inp.bucket,
        "KINETIC_OUTPUT_DIR": inp.output_dir,
        **inp.env,
        **(debug_mode.debug_env(inp.debug_port, inp.debug_wait_s) if inp.debug_port else {}),
    }
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": inp.image,
        "command": list(inp.runner_command),
        "args": args,
        "env": [{"name": k, "value": str(v)} for k, v in env.items() if k not in inp.secrets]
        + [
            {
                "name": k,
                "valueFrom": {"secretKeyRef": {"name": secret_name(inp.job_id), "key": k}},
            }
            for k in sorted(inp.secrets)
        ],
    }
    if inp.debug_port:  # declared on the pod, reached by a port-forward: no Service
        debug_mode.declare_debug_port(container, inp.debug_port)
    resources = _resources(inp)
    if resources:
        container["resources"] = resources
    pod: dict[str, Any] = {"restartPolicy": "Never", "serviceAccountName": inp.service_account}
    capacity = pod_fields(
        inp.capacity, priority_class=inp.priority_class, max_run_duration_s=inp.max_run_duration_s
    )
    own = {k: v for k, v in inp.accelerator.node_selector().items() if k not in capacity.replaces}
    selector = {**own, **capacity.node_selector}
    if selector:
        pod["nodeSelector"] = selector
    if capacity.deadline_s:
        pod["activeDeadlineSeconds"] = capacity.deadline_s
    tolerations = inp.accelerator.tolerations() + capacity.tolerations
    if tolerations:
        pod["tolerations"] = tolerations
    if inp.fuse:
        pod["annotations"] = {"gke-gcsfuse/volumes": "true"}
        pod["volumes"] = [_fuse_volume(i, m) for i, m in enumerate(inp.fuse)]
        container["volumeMounts"] = [
            {"name": f"gcs-fuse-{i}", "mountPath": m.mount_path, "readOnly": True}
            for i, m in enumerate(inp.fuse)
        ]
    labels = {
        "app": "kinetic",
        "job-id": inp.job_id,
        **identity_labels(inp.identity),
        **{k: label_value(v) for k, v in inp.extra_labels.items()},
        **({debug_mode.DEBUG_LABEL: "true"} if inp.debug_port else {}),
    }
    return JobSpec(
        job_id=inp.job_id,
        name=f"kinetic-{inp.job_id}",
        namespace=inp.namespace,
        labels=labels,
        container=container,
        pod=pod,
        accelerator=inp.accelerator,
        fuse=list(inp.fuse),
        # A debug job's pod stays for a look after it ends (kinetic's two hours).
        ttl_seconds=max(inp.ttl_seconds, debug_mode.DEBUG_TTL_S)
        if inp.debug_port
        else inp.ttl_seconds,
        secrets=dict(inp.secrets),
        capacity=capacity,
        num_slices=inp.num_slices,
        max_restarts=inp.max_restarts,
        debug_port=inp.debug_port,
    )


def _fuse_volume(index: int, mount: FuseMount) -> dict[str, Any]:
    options = "implicit-dirs"
    if mount.only_dir:
        options += ",only-dir=" + mount.only_dir
    return {
        "name": f"gcs-fuse-{index}",
        "csi": {
            "driver": FUSE_DRIVER,
            "readOnly": True,
            "volumeAttributes": {"bucketName": mount.bucket, "mountOptions": options},
        },
    }
