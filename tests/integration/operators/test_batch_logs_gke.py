"""Batch children's live logs on the GKE backend, under real ``dag.test()``.

The map operator (sync, or deferred with the batch trigger) talks to the loopback
Kubernetes API double; a kubelet thread plays the Job controller and the node for
each child Job the batch creates: it runs the real runner with the container's args
and env and writes the runner's output into the pod log, which the double serves.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest

from tests.fixtures.airflow_env import task_states
from tests.fixtures.k8s_double import ThreadedDouble, by_code_under_test
from tests.integration.core.backends.k8s import test_gke_dags as gke
from tests.integration.core.backends.k8s.test_gke_dags import (
    JOBS,
    PODS,
    Kubelet,
    ago,
    pod_status,
    run_dag,
)
from tests.integration.operators.test_batch_logs import live_lines

# The GKE DAG tests' fixtures: the API double, the faked Google token, the connections.
google_token, connections = gke.google_token, gke.connections
pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously


class BatchKubelet(Kubelet):
    """Plays the node for ``count`` child Jobs, one after the other as they appear."""

    def __init__(self, double: ThreadedDouble, count: int):
        super().__init__(double)
        self.count = count
        #: job id -> the lines its pod logged
        self.logs: dict[str, list[str]] = {}

    def play(self) -> None:
        for n in range(self.count):
            if not self.until(
                f"child Job {n + 1}",
                lambda d, n=n: len(by_code_under_test(d.sent("POST", JOBS))) > n,
            ):
                return
            job = json.loads(by_code_under_test(self.api.sent("POST", JOBS))[n].body)
            name, template = job["metadata"]["name"], job["spec"]["template"]
            self.pod = f"{name}-x7k2p"
            meta = {**template["metadata"], "name": self.pod, "creationTimestamp": ago(0)}
            self.api.create(PODS, {"metadata": meta, "spec": template["spec"]})
            self.api.patch_status(f"{PODS}/{self.pod}", pod_status("Running", ago(0), running={}))
            code = self.run_the_runner(template["spec"]["containers"][0])
            self.logs[job["metadata"]["labels"]["job-id"]] = list(self.log_lines)
            done = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
            phase = "Succeeded" if code == 0 else "Failed"
            self.api.patch_status(f"{PODS}/{self.pod}", pod_status(phase, terminated=done))
            self.api.patch_status(
                f"{JOBS}/{name}", {"succeeded": 1} if code == 0 else {"failed": 1}
            )


@pytest.mark.parametrize("mode", ["sync", "deferrable"])
def test_gke_children_pod_logs_prefixed_once_in_order(load_dag, connections, api, capfd, mode):
    kubelet = BatchKubelet(api, 3)
    dr = run_dag(load_dag, f"kinetic_batch_logs_gke_{mode}", kubelet, "kinetic_batch_logs_dags.py")
    out = "".join(capfd.readouterr())
    assert dr.state == "failed", task_states(dr)  # input 2 fails on purpose
    assert len(kubelet.logs) == 3
    seen = live_lines(out)
    by_index: dict[int, list[str]] = defaultdict(list)
    for index, lines in seen.items():
        by_index[index] = [t for t, _ in lines]
    for i in range(3):
        pod_lines = next(v for v in kubelet.logs.values() if f"gke child {i} line 0" in v)
        # Every pod line once, in order, prefixed with its child's index (40-byte cap).
        assert by_index[i] == [line.rstrip() for line in pod_lines], (i, by_index[i], pod_lines)
    assert "1 of 3 inputs failed" in out and "ValueError: gke child 2 failed" in out
    assert re.search(r"last \d+ log lines of inputs\[2\]:\n +\[child 2\]", out)
    assert "    [child 2] gke child 2 line 4" in out  # its last lines, in the failure message
