"""The tensor broadcast through the GKE backend: ``dag.test()`` against the Kubernetes
API double, fake-gcs-server as the store (the rendezvous by generation match), and a
kubelet that runs every child Job's real runner at the same time (a quorum needs its
peers alive together, so the one-after-the-other batch kubelet cannot play it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local import RUNNER_MODULE
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.fake_gcs import requires_fake_gcs
from tests.fixtures.k8s_double import ThreadedDouble, by_code_under_test
from tests.integration import test_gke_dags as gke
from tests.integration.test_gke_dags import JOBS, PODS, Kubelet, ago, pod_status, run_dag

pytest.importorskip("torch")
pytest.importorskip("safetensors")

# The GKE DAG tests' fixtures: the API double, the faked Google token, the connections.
api, google_token, connections = gke.api, gke.google_token, gke.connections


class ConcurrentKubelet(Kubelet):
    """Plays the node for ``count`` child Jobs, each in its own thread as it appears."""

    def __init__(self, double: ThreadedDouble, count: int):
        super().__init__(double)
        self.count = count
        self.codes: dict[str, int] = {}
        self.outputs: dict[str, str] = {}

    def play(self) -> None:
        threads = []
        for n in range(self.count):
            if not self.until(
                f"child Job {n + 1}",
                lambda d, n=n: len(by_code_under_test(d.sent("POST", JOBS))) > n,
            ):
                break
            job = json.loads(by_code_under_test(self.api.sent("POST", JOBS))[n].body)
            thread = threading.Thread(target=self.play_child, args=(job,), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(200)

    def play_child(self, job: dict[str, Any]) -> None:
        name, template = job["metadata"]["name"], job["spec"]["template"]
        pod = f"{name}-x7k2p"
        meta = {**template["metadata"], "name": pod, "creationTimestamp": ago(0)}
        self.api.create(PODS, {"metadata": meta, "spec": template["spec"]})
        self.api.patch_status(f"{PODS}/{pod}", pod_status("Running", ago(0), running={}))
        container = template["spec"]["containers"][0]
        env = {e["name"]: self.env_value(e) for e in container["env"]}
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
        env["KINETIC_STATCACHE_DIR"] = os.environ.get("KINETIC_STATCACHE_DIR", "")
        proc = subprocess.run(
            [sys.executable, "-u", "-m", RUNNER_MODULE, *container["args"]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=180,
            check=False,
        )
        self.codes[name], self.outputs[name] = proc.returncode, proc.stdout.decode()
        self.api.write_log(gke.NS, pod, *self.outputs[name].splitlines())
        code = proc.returncode
        done = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        phase = "Succeeded" if code == 0 else "Failed"
        self.api.patch_status(f"{PODS}/{pod}", pod_status(phase, terminated=done))
        self.api.patch_status(f"{JOBS}/{name}", {"succeeded": 1} if code == 0 else {"failed": 1})


@requires_fake_gcs
def test_tensor_broadcast_between_gke_children(load_dag, connections, api) -> None:
    kubelet = ConcurrentKubelet(api, 2)
    dr = run_dag(load_dag, "kinetic_gke_tensors", kubelet, "kinetic_gke_tensor_dags.py")
    assert dr.state == "success", (task_states(dr), kubelet.outputs)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    published, got = x[("publish", "return_value")], x[("receive", "return_value")]
    assert sorted(r["rank"] for r in got) == [0, 1]
    assert {r["sum"] for r in got} == {published["sum"]}
    # Only rank 0 read the key's blob from the bucket; the other got it from rank 0.
    assert sorted((r["source"], len(r["reads"])) for r in got) == [("peer", 0), ("store", 1)]
