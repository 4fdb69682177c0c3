"""GKE and Kueue facts behind each capacity kind: node selectors, tolerations, labels.

Every key and value here was confirmed against the page cited beside it; a wrong key
is a pod that never schedules on a real cluster.  Data and tiny builders only
(``core/catalog/capacity.py`` decides when each applies).  Stdlib-only.
"""

from __future__ import annotations

# -- DWS flex-start ---------------------------------------------------------------------
# https://docs.cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training
#   (the pod selects `cloud.google.com/gke-flex-start: "true"` next to its accelerator;
#   no toleration; the run limit is the node pool's --max-run-duration, seven days by
#   default and at most)
# https://cloud.google.com/kubernetes-engine/docs/concepts/dws
#   (TPU v5e, v5p and Trillium v6e; "TPU v3 and v4 are not supported"; TPUs "that can
#   run in single-host TPU slice node pools"; multi-host slices go through Kueue)
FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
#: GKE's limit on a flex-start VM's run: seven days.  A pod cannot set its VM's limit
#: (the node pool or a ProvisioningRequest does), so the job's own deadline is set to it:
#: a job that would outlive its VM ends with a clear DeadlineExceeded instead.
FLEX_START_MAX_RUN_S = 7 * 24 * 3600.0
#: TPU generations (catalog names) GKE offers flex-start for.
FLEX_START_TPUS = frozenset({"v5litepod", "v5p", "v6e"})

# -- Specific reservations --------------------------------------------------------------
# https://docs.cloud.google.com/ai-hypercomputer/docs/create/gke-ai-hypercompute-custom
#   (nodeSelector reservation-name + reservation-affinity: "specific")
# https://docs.cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes
#   (`cloud.google.com/reservation-project` for a reservation shared from another project)
# https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations
RESERVATION_NAME_LABEL = "cloud.google.com/reservation-name"
RESERVATION_AFFINITY_LABEL = "cloud.google.com/reservation-affinity"
RESERVATION_PROJECT_LABEL = "cloud.google.com/reservation-project"

# -- Custom compute classes -------------------------------------------------------------
# https://docs.cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes
#   ("GKE rejects any Pods that select system labels that have a corresponding field in
#   the ComputeClass" -- gke-accelerator, gke-tpu-*, gke-spot, reservation-* -- "and
#   also request Spot VMs": the class decides the hardware; the pod keeps its requests)
COMPUTE_CLASS_LABEL = "cloud.google.com/compute-class"

# -- Kueue (and GKE's queued provisioning behind a Kueue queue) --------------------------
# https://kueue.sigs.k8s.io/docs/tasks/run/jobs/ (the queue label on the Job)
# https://kueue.sigs.k8s.io/docs/tasks/run/leaderworkerset/ (on the LWS's metadata.labels;
#   its pods wait behind the scheduling gate kueue.x-k8s.io/admission)
# https://kueue.sigs.k8s.io/docs/concepts/workload_priority_class/
# https://docs.cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest
#   (`suspend: true`, "Kueue changes that flag to false"; the max run duration annotation;
#   queued-provisioning node pools carry the cloud.google.com/gke-queued taint)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MAX_RUN_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
QUEUED_TAINT = "cloud.google.com/gke-queued"

#: The accelerator selector keys a compute class replaces (see the page above).
CLASS_REPLACES = frozenset(
    {
        "cloud.google.com/gke-accelerator",
        "cloud.google.com/gke-tpu-accelerator",
        "cloud.google.com/gke-tpu-topology",
        "cloud.google.com/gke-spot",
    }
)


def capacity_selectors(kind: str, name: str | None, project: str | None) -> dict[str, str]:
    """The node selector entries a capacity kind adds to the pod."""
    if kind == "flex-start":
        return {FLEX_START_LABEL: "true"}
    if kind == "reservation":
        selector = {RESERVATION_NAME_LABEL: str(name), RESERVATION_AFFINITY_LABEL: "specific"}
        if project:
            selector[RESERVATION_PROJECT_LABEL] = project
        return selector
    if kind == "class":
        return {COMPUTE_CLASS_LABEL: str(name)}
    return {}


def capacity_tolerations(kind: str) -> list[dict[str, str]]:
    """Tolerations a capacity kind adds (beyond the accelerator's own taints): a queue
    may be backed by queued-provisioning node pools, which GKE taints."""
    if kind == "queue":
        return [{"key": QUEUED_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return []


def queue_labels(queue: str | None, priority_class: str | None) -> dict[str, str]:
    """The labels Kueue reads on a Job or LeaderWorkerSet."""
    labels = {QUEUE_LABEL: str(queue)}
    if priority_class:
        labels[PRIORITY_LABEL] = priority_class
    return labels
