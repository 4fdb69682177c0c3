"""Kubernetes objects that wrap the one :class:`JobSpec`: a batch/v1 Job, a LeaderWorkerSet
and (several TPU slices) a JobSet.

Pure functions, no client, no network: the GKE and Pathways backends send exactly
these dicts, ``Backend.manifest`` shows them as a dry run, and the tests validate
them against the Kubernetes (and LWS CRD) schemas.  Names, labels and env follow
kinetic 0.0.4 (protocol notes §2.1, §2.8, §2.10) so kinetic's CLI sees our jobs.
"""

from __future__ import annotations

import copy
from typing import Any

from airflow_provider_kinetic.core.spec.failure import USER_ERROR_EXIT
from airflow_provider_kinetic.core.spec.peerport import declare_peer_port
from airflow_provider_kinetic.core.spec.pod import CONTAINER_NAME, JobSpec, secret_name

#: Label that marks every Job (and pod) of one batch, so one list call answers for
#: all children (``Backend.batch_status``).  Set it through ``SpecInputs.extra_labels``.
GROUP_LABEL = "kinetic-group-id"
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_PLURAL = "leaderworkersets"
LWS_DEFAULT_VERSION = "v1"
#: Recreate the whole group when any pod restarts: a multi-host JAX program cannot
#: continue with one host replaced, so a partial restart would only hang.
LWS_RESTART_POLICY = "RecreateGroupOnPodRestart"
_MULTI_HOST_ENV = frozenset(
    {"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "TPU_WORKER_ID", "KINETIC_LWS"}
)
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_PLURAL = "jobsets"
JOBSET_VERSION = "v1alpha2"
#: The replicated job whose ``replicas`` Jobs are the slices (one Job per slice).
SLICE_JOB = "slice"
#: One slice per node pool: JobSet places each child Job on a topology domain of its own
#: (https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice, and JobSet's
#: ``ExclusiveKey`` in api/jobset/v1alpha2/jobset_types.go).
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
#: Pod labels JobSet sets (jobset_types.go): the slice's index, and kinetic's own label
#: that selects every pod of one JobSet.
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
JOBSET_POD_LABEL = "kinetic-jobset"
#: The Indexed Job's annotation with a pod's index: the host within its slice.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: The megascale (DCN) port every host of a multi-slice job listens on.
#: The megascale names are confirmed in JAX's own source, which reads them
#: (jax-ml/jax jax/_src/clusters/cloud_tpu_cluster.py at cec06d1, BaseTpuCluster:
#: MEGASCALE_COORDINATOR_ADDRESS, "for GKE via JobSet ... the host with process id = 0",
#: so slice 0 host 0; MEGASCALE_NUM_SLICES; MEGASCALE_SLICE_ID; a process's id is its
#: id within the slice + slice id x hosts per slice, as runner/invocation.host_index
#: counts).  MEGASCALE_PORT is read by libtpu, not JAX: its name and 8080 are those
#: Google's xpk sets on its multi-slice JobSets (AI-Hypercomputer/xpk
#: src/xpk/commands/workload.py, which also takes MEGASCALE_SLICE_ID from the job-index
#: label), and Ray's documented TPU helper returns the same four
#: (https://docs.ray.io/en/latest/ray-core/api/doc/ray.util.tpu.get_tpu_coordinator_env_vars.html).
#: GKE's multislice page (https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice)
#: is cited for the JobSet shape; it names no variable.
MEGASCALE_PORT = 8080
#: Hosts per slice, for the runner: host ``slice * hosts + worker`` is the job's host
#: index, so only slice 0 host 0 writes the result (``runner/invocation.host_index``).
SLICE_HOSTS_ENV = "KINETIC_SLICE_HOSTS"
_SLICE_ENV = _MULTI_HOST_ENV | {"MEGASCALE_SLICE_ID", "MEGASCALE_PORT", SLICE_HOSTS_ENV}
#: Written by the runner of an LWS host that finished successfully; it then idles
#: instead of exiting (an exit restarts the group and would run the function again),
#: and this file makes the pod Ready: how the status read knows the job is done.
FINISHED_FILE = "/tmp/kinetic-finished"


def job_name(job_id: str) -> str:
    """GKE Job name (kinetic: ``kinetic-{job_id}``)."""
    return f"kinetic-{job_id}"


def lws_name(job_id: str) -> str:
    """LeaderWorkerSet name (kinetic: ``keras-pathways-{job_id}``)."""
    return f"keras-pathways-{job_id}"


def jobset_name(job_id: str) -> str:
    """JobSet name of a multi-slice job (``kinetic-slices-{job_id}``)."""
    return f"kinetic-slices-{job_id}"


def slice_pod_host(name: str, slice_index: int = 0, host: int = 0) -> str:
    """The DNS name of a slice's host (JobSet's headless service is named like the JobSet)."""
    return f"{name}-{SLICE_JOB}-{slice_index}-{host}.{name}"


def leader_pod_name(name: str) -> str:
    """The leader pod of group 0 of the LeaderWorkerSet ``name``."""
    return f"{name}-0"


def job_manifest(spec: JobSpec) -> dict[str, Any]:
    """The batch/v1 Job for ``spec``.

    ``backoffLimit: 0`` because the payload is not idempotent (it writes its
    result and outputs): a retry belongs to Airflow, which knows about it.
    """
    name = spec.name  # the builder's name: kinetic-{job_id}
    labels = {**spec.labels, **spec.capacity.owner_labels}
    queued = {"suspend": True} if spec.capacity.suspend else {}  # Kueue admits, unsuspends
    # A deep copy, so a caller editing the manifest never edits the spec.
    template = copy.deepcopy(spec.pod_template({"job-name": name}))
    for container in template["spec"]["containers"]:
        declare_peer_port(container)  # batch peers read from this pod (core/keys/peer/registry.py)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": labels,
            **_annotations(spec),
        },
        "spec": {
            **queued,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": spec.ttl_seconds,
            "template": template,
        },
    }


def lws_manifest(
    spec: JobSpec, api_version: str = f"{LWS_GROUP}/{LWS_DEFAULT_VERSION}"
) -> dict[str, Any]:
    """The LeaderWorkerSet for a multi-host ``spec`` (one group of ``num_nodes`` pods).

    The pod template is the Job's with four differences: label ``app`` is
    ``kinetic-pathways`` (kinetic's selector for these pods); there is no
    ``restartPolicy`` (LWS creates StatefulSets from these templates, and
    StatefulSet validation accepts only the default ``Always``); the container
    gets the multi-host env, where the coordinator address and this host's index
    come from variables the LWS webhook injects (the kubelet expands ``$(...)``);
    and, because a pod that exits is restarted (and the group recreated), a finished
    runner idles and signals completion through a readiness probe on
    ``FINISHED_FILE`` (``KINETIC_LWS=1`` tells it so): a finished leader is never
    restarted, and a restarted host never runs the function twice.
    """
    name = lws_name(spec.job_id)
    hosts = spec.accelerator.num_nodes
    template = copy.deepcopy(spec.pod_template({"app": "kinetic-pathways", "job-name": name}))
    template["spec"].pop("restartPolicy", None)
    for container in template["spec"]["containers"]:
        env = [e for e in container.get("env", []) if e["name"] not in _MULTI_HOST_ENV]
        container["env"] = env + [
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": "$(LWS_LEADER_ADDRESS)"},
            # kinetic puts the host count here (not a slice count); keep it identical.
            {"name": "MEGASCALE_NUM_SLICES", "value": str(hosts)},
            {"name": "TPU_WORKER_ID", "value": "$(LWS_WORKER_INDEX)"},
            {"name": "KINETIC_LWS", "value": "1"},
        ]
        declare_peer_port(container)
        container["readinessProbe"] = {
            "exec": {"command": ["test", "-e", FINISHED_FILE]},
            "periodSeconds": 5,
        }
    return {
        "apiVersion": api_version,
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            # Kueue's LeaderWorkerSet integration reads the queue label here.
            "labels": {**spec.labels, **spec.capacity.owner_labels, "app": "kinetic-pathways"},
            **_annotations(spec),
        },
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": hosts,
                "restartPolicy": LWS_RESTART_POLICY,
                "leaderTemplate": template,
                "workerTemplate": copy.deepcopy(template),
            },
        },
    }


def jobset_manifest(spec: JobSpec) -> dict[str, Any]:
    """The JobSet for ``spec.num_slices`` slices of a multi-host TPU ``spec``.

    One replicated job ``slice`` with one Job per slice (``replicas``), each an Indexed
    Job of the slice's hosts (``parallelism = completions = hosts``), placed each on a
    node pool of its own (the exclusive-topology annotation).  The pod template is the
    Job's (node selector, tolerations, capacity fields, Data mounts) plus the megascale
    environment every host needs: the coordinator (slice 0 host 0), the number of slices,
    this pod's slice (its ``job-index`` label), the port, and ``TPU_WORKER_ID`` (its
    completion index).  Names checked against GKE's multislice page and its JobSet
    example: https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice.

    One failure policy for the gang: a failed Job (``backoffLimit: 0``: a host's failure
    fails its slice's Job at once) restarts the whole JobSet, at most
    ``spec.max_restarts`` times; every restarted host runs again and claims the next
    attempt (``KINETIC_ATTEMPT``, ``runner/resume.py``), resuming from its checkpoint.
    A user error is not restarted: its host exits ``USER_ERROR_EXIT``, the Job's pod
    failure policy fails the Job (reason ``PodFailurePolicy``) and the JobSet's rule
    fails the gang (kubernetes-sigs/jobset v0.12.0: keps/262-ConfigurableFailurePolicy and
    site/static/examples/failure-policy/onjobfailurereasons-present-podfailurepolicy.yaml;
    https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy).
    """
    name = jobset_name(spec.job_id)
    hosts = spec.accelerator.num_nodes
    labels = {**spec.labels, **spec.capacity.owner_labels}
    # ``job-name``: the JobSet's, on every pod of every slice (the shared reads select by it;
    # the Job controller keeps a template's own job-name label).
    template = copy.deepcopy(spec.pod_template({JOBSET_POD_LABEL: name, "job-name": name}))
    for container in template["spec"]["containers"]:
        env = [e for e in container.get("env", []) if e["name"] not in _SLICE_ENV]
        container["env"] = env + [
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": slice_pod_host(name)},
            {"name": "MEGASCALE_NUM_SLICES", "value": str(spec.num_slices)},
            {"name": "MEGASCALE_SLICE_ID", "valueFrom": _field(f"labels['{JOB_INDEX_LABEL}']")},
            {"name": "MEGASCALE_PORT", "value": str(MEGASCALE_PORT)},
            {"name": "TPU_WORKER_ID", "valueFrom": _field(f"annotations['{COMPLETION_INDEX}']")},
            {"name": SLICE_HOSTS_ENV, "value": str(hosts)},
        ]
        declare_peer_port(container)
    queued = {"suspend": True} if spec.capacity.suspend else {}  # Kueue admits, unsuspends
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": {
                **spec.capacity.owner_annotations,
                EXCLUSIVE_TOPOLOGY: NODE_POOL_LABEL,
            },
        },
        "spec": {
            **queued,
            "ttlSecondsAfterFinished": spec.ttl_seconds,
            "network": {"enableDNSHostnames": True},
            "failurePolicy": {
                "maxRestarts": spec.max_restarts,
                "rules": [
                    {
                        "name": "userError",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }
                ],
            },
            "replicatedJobs": [
                {
                    "name": SLICE_JOB,
                    "replicas": spec.num_slices,
                    "template": {
                        # The JobSet's labels without Kueue's: Kueue admits the JobSet.
                        "metadata": {"labels": dict(spec.labels)},
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "podFailurePolicy": {"rules": [_USER_ERROR_RULE]},
                            "template": template,
                        },
                    },
                }
            ],
        },
    }


_USER_ERROR_RULE = {
    "action": "FailJob",
    "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "In", "values": [USER_ERROR_EXIT]},
}


def _field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": f"metadata.{path}"}}


def _annotations(spec: JobSpec) -> dict[str, Any]:
    """The owner object's annotations (a capacity step's, e.g. Kueue's run limit)."""
    found = spec.capacity.owner_annotations
    return {"annotations": dict(found)} if found else {}


def secret_manifest(spec: JobSpec) -> dict[str, Any] | None:
    """The Secret with the job's secret env (``None`` when it has none).

    Created before the Job/LWS and then owned by it (``owner_reference``), so deleting
    the job deletes its secrets; never part of a dry run's output.
    """
    if not spec.secrets:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(spec.job_id),
            "namespace": spec.namespace,
            "labels": dict(spec.labels),
        },
        "type": "Opaque",
        "stringData": dict(spec.secrets),
    }


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    """An ownerReference to a created object (its reply carries the uid)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
    }


def to_yaml(manifest: dict[str, Any]) -> str:
    """YAML for ``kubectl apply -f -`` (key order kept, so it reads like the dict)."""
    import yaml  # the kubernetes client depends on PyYAML; only needed here

    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
