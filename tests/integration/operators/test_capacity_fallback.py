"""Capacity fallback chains end to end: real Airflow ``dag.test()`` against the
Kubernetes API double, a "kubelet" thread playing the node.

The first step's pod stays unschedulable (PodScheduled False, as the scheduler says
when no node fits); after ``capacity_wait`` the operator deletes that Job and creates
the next step's, which the kubelet runs with the real runner.  The function runs once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from tests.fixtures.airflow_env import task_states
from tests.fixtures.k8s_double import by_code_under_test
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures
    JOBS,
    PODS,
    Kubelet,
    _xcoms,
    ago,
    connections,
    google_token,
    run_dag,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
}


class NoCapacityFirst(Kubelet):
    """The first Job's pod never schedules; the next Job runs for real."""

    first: dict[str, Any] | None = None

    def play(self) -> None:
        posts = self.until("the first Job", lambda d: by_code_under_test(d.sent("POST", JOBS)))
        if not posts:
            return
        self.first = json.loads(posts[0].body)
        name, template = self.first["metadata"]["name"], self.first["spec"]["template"]
        pod = f"{name}-unsch"
        meta = {**template["metadata"], "name": pod, "creationTimestamp": ago(0)}
        self.api.create(PODS, {"metadata": meta, "spec": template["spec"]})
        self.api.patch_status(f"{PODS}/{pod}", {"phase": "Pending", "conditions": [UNSCHEDULABLE]})
        posts = self.until(
            "the next step's Job", lambda d: len(by_code_under_test(d.sent("POST", JOBS))) > 1
        )
        if posts:
            self.play_job(json.loads(by_code_under_test(self.api.sent("POST", JOBS))[1].body))


@pytest.mark.parametrize("mode", ["sync", "deferrable"])
def test_an_unschedulable_reservation_falls_back_to_spot_and_runs_once(
    load_dag,
    connections,  # noqa: F811 - the fixture
    api,
    capfd,
    mode,
):
    kubelet = NoCapacityFirst(api)
    dr = run_dag(load_dag, f"kinetic_capacity_fallback_{mode}", kubelet, "kinetic_capacity_dags.py")
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)

    first, second = kubelet.first, kubelet.job
    assert first is not None and second
    selector = first["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/reservation-name"] == "r1"
    assert selector["cloud.google.com/reservation-affinity"] == "specific"
    spot = second["spec"]["template"]["spec"]
    assert spot["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert "cloud.google.com/reservation-name" not in spot["nodeSelector"]

    # Exactly two Jobs, the first deleted before the second was created; one run.
    assert len(by_code_under_test(api.sent("POST", JOBS))) == 2
    first_name, second_name = first["metadata"]["name"], second["metadata"]["name"]
    deletes = [r.url.path for r in api.sent("DELETE", JOBS)]
    assert f"{JOBS}/{first_name}" in deletes
    first_id = first["metadata"]["labels"]["job-id"]
    second_id = second["metadata"]["labels"]["job-id"]
    x = _xcoms(dr)
    assert x[("train", "return_value")]["job_id"] == second_id  # ran once, on spot
    handle = x[("train", "kinetic_job")]
    assert (handle["job_id"], handle["capacity"]) == (second_id, "spot")
    assert handle["accelerator"].endswith(":spot")
    assert api.read(f"{JOBS}/{second_name}") is None  # collected

    # The task log says what was asked, why it was given up and which step won.
    assert f"kinetic job {first_id} asks for capacity: reservation r1" in out
    assert f"kinetic job {first_id}: giving up reservation r1 (capacity step 1 of 2)" in out, out
    assert "trying spot (capacity step 2 of 2)" in out
    assert f"kinetic job {second_id} asks for capacity: spot" in out

    store = GcsStore(connections)
    abandoned = history.read(store, first_id)
    assert abandoned["state"] == "CANCELLED" and abandoned["reason"].startswith("NoCapacity")
    assert history.read(store, second_id)["state"] == "SUCCEEDED"


class AdmittedLater(Kubelet):
    """Kueue's part: the Job stays suspended until the operator has seen it waiting,
    then is admitted (unsuspended) and runs."""

    def play(self) -> None:
        posts = self.until("the Job", lambda d: by_code_under_test(d.sent("POST", JOBS)))
        if not posts:
            return
        job = json.loads(posts[0].body)
        path = f"{JOBS}/{job['metadata']['name']}"
        # Read on its own (the task) or in a list (a deferred task's shared reader).
        seen = self.until(
            "the task to read the suspended Job twice",
            lambda d: len(by_code_under_test(d.sent("GET", JOBS))) >= 2,
        )
        if seen:
            self.api.patch(path, {"spec": {"suspend": False}})
            self.play_job(job)


@pytest.mark.parametrize("mode", ["sync", "deferrable"])
def test_a_queued_job_waits_for_admission_and_its_usage_says_when(
    load_dag,
    connections,  # noqa: F811 - the fixture
    api,
    capfd,
    mode,
):
    kubelet = AdmittedLater(api)
    dr = run_dag(load_dag, f"kinetic_capacity_queue_{mode}", kubelet, "kinetic_capacity_dags.py")
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)
    job = kubelet.job
    assert job["spec"]["suspend"] is True  # created suspended: Kueue admits it
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    job_id = labels["job-id"]
    assert (
        f"kinetic job {job_id}: PENDING (NotAdmitted): waiting for admission in queue team-a"
        in (out)
    )
    entry = history.read(GcsStore(connections), job_id)
    assert entry["state"] == "SUCCEEDED" and entry["capacity"] == "queue:team-a"
    assert entry["admitted_at"] is not None  # seen leaving the queue (worker or triggerer)
    usage = _xcoms(dr)[("train", "kinetic_usage")]
    assert (usage["capacity"], usage["attempts"]) == ("queue:team-a", 1)
    assert "kinetic usage: gpu-l4x1 on queue:team-a: " in out
