"""Peers through the real runner: a ``KineticMapOperator(..., broadcast=True)`` batch
whose children get a key by tree broadcast (``store.get(broadcast=)``), get their
shared ``Data`` as a tree, and hand each other ``locale="local"`` keys.  On the local
backend, and on the GKE backend (the API double, its kubelet running each child's
runner at once, fake-gcs-server).  The job env (scope, token), the pod's declared
port and the runner's end (registrations removed) are the real ones."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data.value import content_hash_of
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.fake_gcs import requires_fake_gcs
from tests.fixtures.k8s_double import by_code_under_test
from tests.integration.core.backends.k8s import test_gke_dags as gke
from tests.integration.core.backends.k8s.test_gke_dags import (
    JOBS,
    PODS,
    Kubelet,
    ago,
    pod_status,
    run_dag,
)

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")
CHILDREN = 3
google_token, connections = gke.google_token, gke.connections
pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One work dir for the module: the DAG file reads it once, when first parsed."""
    return tmp_path_factory.mktemp("peers-work")


def shared_data(work: Path) -> str:
    """The batch's shared Data (made once per module) and its content hash."""
    shared = work / "shared"
    if not shared.exists():
        (shared / "inner").mkdir(parents=True)
        for i in range(5):
            (shared / "inner" / f"s{i}.bin").write_bytes(os.urandom(20_000))
    return content_hash_of(str(shared), stat_cache=None)


def check_batch(dr: Any, data_hash: str, out: str, store: ObjectStore, prefix: str) -> None:
    assert dr.state == "success", task_states(dr)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    published, rows = x[("publish", "return_value")], x[("children", "return_value")]
    assert len(rows) == CHILDREN
    for i, row in enumerate(rows):
        assert row["key_version"] == published["version"]
        assert row["data_hash"] == data_hash
        assert row["local_put"] == "local"
        assert row["neighbour_text"] == f"from child {(i + 1) % CHILDREN}"
        assert re.fullmatch(r"127\.0\.0\.1:\d+", row["neighbour_source"] or ""), row
    # The key: one child read the store, the others a peer (fanout 1: a chain).
    sources = sorted(r["key_sources"][0] for r in rows)
    assert sources.count("store") == 1, sources
    assert sum(r["key_read"]["store"] for r in rows) == published["size"]
    # The shared Data: the runners' logs say where each child's copy came from.
    came = re.findall(r"data [0-9a-f]{12}: \d+ file\(s\) by broadcast from (\S+), verified", out)
    assert sorted(c.rstrip(",") == "store" for c in came) == [False, False, True], came
    # Every child's runner removed its registrations at its end.
    assert "ends with the job" in out
    assert store.list("default/peers/") == []


def test_batch_peers_on_the_local_backend(
    load_dag, airflow_home: Path, work: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    monkeypatch.setenv("KINETIC_PEERS_TEST_DIR", str(work))
    monkeypatch.setenv("KINETIC_LOCAL_MAX_JOBS", str(CHILDREN))  # the children meet
    data_hash = shared_data(work)
    dr = load_dag("kinetic_peers_dags.py", "kinetic_peers_local").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    store = KineticConfig(backend="local", root=str(airflow_home / "kinetic")).store()
    check_batch(dr, data_hash, out, store, "peers-local")


class ConcurrentKubelet(Kubelet):
    """Plays the node for ``count`` child Jobs, running each child's runner as soon as
    its Job appears, all at once (peers must meet)."""

    def __init__(self, double: Any, count: int) -> None:
        super().__init__(double)
        self.count, self.threads, self.logs = count, [], {}
        self.containers: list[dict[str, Any]] = []

    def play(self) -> None:
        for n in range(self.count):
            if not self.until(
                f"child Job {n + 1}",
                lambda d, n=n: len(by_code_under_test(d.sent("POST", JOBS))) > n,
            ):
                return
            job = json.loads(by_code_under_test(self.api.sent("POST", JOBS))[n].body)
            thread = threading.Thread(target=self.one, args=(job,), daemon=True)
            thread.start()
            self.threads.append(thread)
        for thread in self.threads:
            thread.join(150)

    def one(self, job: dict[str, Any]) -> None:
        name, template = job["metadata"]["name"], job["spec"]["template"]
        pod = f"{name}-x7k2p"
        meta = {**template["metadata"], "name": pod, "creationTimestamp": ago(0)}
        self.api.create(PODS, {"metadata": meta, "spec": template["spec"]})
        self.api.patch_status(f"{PODS}/{pod}", pod_status("Running", ago(0), running={}))
        container = template["spec"]["containers"][0]
        self.containers.append(container)
        code, lines = self.run_container(container, pod)
        self.logs[name] = lines
        done = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        phase = "Succeeded" if code == 0 else "Failed"
        self.api.patch_status(f"{PODS}/{pod}", pod_status(phase, terminated=done))
        self.api.patch_status(f"{JOBS}/{name}", {"succeeded": 1} if code == 0 else {"failed": 1})

    def run_container(self, container: dict[str, Any], pod: str) -> tuple[int, list[str]]:
        import subprocess
        import sys

        env = {e["name"]: self.env_value(e) for e in container["env"]}
        env["STORAGE_EMULATOR_HOST"] = os.environ["STORAGE_EMULATOR_HOST"]
        proc = subprocess.run(
            [sys.executable, "-u", "-m", gke.RUNNER_MODULE, *container["args"]],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150, check=False,
        )  # fmt: skip
        lines = proc.stdout.decode().splitlines()
        self.api.write_log(gke.NS, pod, *lines)
        return proc.returncode, lines


@requires_fake_gcs
def test_batch_peers_on_the_gke_backend(
    load_dag,
    connections,  # noqa: F811
    api,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KINETIC_PEERS_TEST_DIR", str(work))
    data_hash = shared_data(work)
    kubelet = ConcurrentKubelet(api, CHILDREN)
    dr = run_dag(load_dag, "kinetic_peers_gke", kubelet, "kinetic_peers_dags.py")
    out = "\n".join(sum(kubelet.logs.values(), []))  # the pods' own logs, once each
    check_batch(dr, data_hash, out, GcsStore(connections), "peers-gke")
    # Each pod declares the peer port and learns its IP from the downward API; the
    # children share one scope (the batch) and get its token as a Secret.
    for container in kubelet.containers:
        assert container["ports"] == [
            {"name": "kinetic-peer", "containerPort": 8471, "protocol": "TCP"}
        ]
        env = {e["name"]: e for e in container["env"]}
        assert env["KINETIC_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert "secretKeyRef" in env["KINETIC_PEER_TOKEN"]["valueFrom"]
    assert len({c_env(c)["KINETIC_PEER_SCOPE"] for c in kubelet.containers}) == 1


def c_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}
