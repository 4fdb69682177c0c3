"""``airflow kinetic jobs debug``: on GKE a port-forward to the debug job's pod through
the Kubernetes API (the API double's ``pods/portforward`` websocket, relayed to a
loopback socket standing for the pod's debugpy), VS Code's launch.json with it; a job
that is not a debug job is refused; the pod of a debug job declares its port, TTL and
env (schema-validated)."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from airflow_provider_kinetic.cli.common import CliError
from airflow_provider_kinetic.cli.debug import debug_session
from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.spec.debug import READY_NAME
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures import records
from tests.fixtures.k8s_double import ThreadedDouble, to_json
from tests.fixtures.waiting import wait_for

NS = "default"
JOB_ID = "job-00debug0"
JOB = f"kinetic-{JOB_ID}"
POD = f"{JOB}-x1"
PORT = 5678


def debug_manifest(port: int | None = PORT) -> dict[str, Any]:
    bucket = "proj-kn-c1-jobs"
    spec = build_job_spec(
        SpecInputs(
            job_id=JOB_ID,
            bucket=bucket,
            accelerator=parse_accelerator("gpu:l4:spot"),
            context_uri=f"gs://{bucket}/{JOB_ID}/context.zip",
            payload_uri=f"gs://{bucket}/{JOB_ID}/payload.pkl",
            result_uri=f"gs://{bucket}/{JOB_ID}/result.pkl",
            payload_sha256="a" * 64,
            context_sha256="b" * 64,
            image="us-docker.pkg.dev/proj/kn-c1/base:gpu-0123456789ab",
            output_dir=f"gs://{bucket}/outputs/",
            identity={"dag_id": "d", "task_id": "t"},
            debug_port=port,
            debug_wait_s=90.0,
        )
    )
    return job_manifest(spec)


def test_a_debug_jobs_manifest_carries_its_port_ttl_and_env() -> None:
    manifest = debug_manifest()
    assert kubernetes_validate.validate(manifest, "1.33", strict=True) == "1.33"
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "debugpy", "containerPort": PORT, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KINETIC_DEBUG_PORT"] == str(PORT) and env["KINETIC_DEBUG_WAIT_S"] == "90"
    assert env["PYTHONBREAKPOINT"] == "debugpy.breakpoint"
    assert "KINETIC_DEBUG" not in env  # kinetic 0.0.4's own switch: its runner ignores ours
    assert manifest["spec"]["ttlSecondsAfterFinished"] == 7200
    assert manifest["spec"]["template"]["metadata"]["labels"]["kinetic-debug"] == "true"
    plain = debug_manifest(None)
    plain_container = plain["spec"]["template"]["spec"]["containers"][0]
    assert "ports" not in plain_container and plain["spec"]["ttlSecondsAfterFinished"] == 600
    assert "KINETIC_DEBUG_PORT" not in {e["name"] for e in plain_container["env"]}


def _echo_server() -> tuple[socket.socket, int]:
    """A loopback socket standing for the pod's debugpy: it echoes what it is sent."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.k8s_api(threaded=True)
def test_jobs_debug_forwards_a_local_port_to_the_pod_through_the_api(
    api: ThreadedDouble, tmp_path: Path
) -> None:
    api.create(f"/apis/batch/v1/namespaces/{NS}/jobs", to_json(debug_manifest()))
    meta = {"name": POD, "labels": {"job-name": JOB}}
    api.create(f"/api/v1/namespaces/{NS}/pods", {"metadata": meta, "spec": {"containers": [
        {"name": "kinetic-worker", "image": "img"}]}})  # fmt: skip
    api.patch_status(f"/api/v1/namespaces/{NS}/pods/{POD}", {"phase": "Running"})
    server, pod_port = _echo_server()
    api.double.pod_ports[(NS, POD)] = {PORT: ("127.0.0.1", pod_port)}
    store = LocalStore(str(tmp_path / "store"))
    handle = records.handle(JOB_ID, "b", "gke", namespace=NS, k8s_name=JOB, debug=True,
                            debug_port=PORT)  # fmt: skip
    backend = GkeBackend(api.double.client_factory())
    out, stop, failed = io.StringIO(), threading.Event(), []

    def session() -> None:
        try:
            debug_session(handle, backend, store, 0, out, stop, poll_s=0.05)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            failed.append(exc)

    cli = threading.Thread(target=session, daemon=True)
    cli.start()
    try:
        # Until the runner's ready marker is there, it waits (the pod runs, debugpy not yet).
        wait_for("the waiting line", lambda: "waiting for its debugpy server" in out.getvalue())
        assert "forwarding" not in out.getvalue()
        ready = {"host": "127.0.0.1", "port": PORT, "code_root": "/tmp/kinetic-run-x"}
        store.write_bytes(f"{JOB_ID}/{READY_NAME}", json.dumps(ready).encode())
        said = wait_for(
            "the forward's line",
            lambda: re.search(r"forwarding 127\.0\.0\.1:(\d+) -> pod", out.getvalue()) or failed,
            detail=out.getvalue,
        )
        assert not failed, failed
        local = int(said.group(1))
        with socket.create_connection(("127.0.0.1", local)) as conn:
            conn.sendall(b"Content-Length: 2\r\n\r\n{}")
            got = b""
            while len(got) < 23:
                got += conn.recv(4096) or b"!"
        assert got == b"Content-Length: 2\r\n\r\n{}"
        asked = api.sent("GET", f"/pods/{POD}/portforward")
        assert [r.params["ports"] for r in asked] == [str(PORT)]
        launch = json.loads(out.getvalue().split("Debugging", 1)[1].split(":\n", 1)[1].split(
            "\nkinetic", 1)[0])  # fmt: skip
        attach = launch["configurations"][0]
        assert attach["connect"] == {"host": "127.0.0.1", "port": local}
        assert attach["pathMappings"][0]["remoteRoot"] == "/tmp/kinetic-run-x"
        # The job ends: the forward closes by itself.
        api.patch_status(f"/apis/batch/v1/namespaces/{NS}/jobs/{JOB}", {"succeeded": 1})
        cli.join(timeout=60)
        assert not cli.is_alive() and not failed, failed
        assert out.getvalue().endswith("port-forward closed\n")
    finally:
        stop.set()
        cli.join(timeout=60)
        server.close()


@pytest.mark.k8s_api(threaded=True)
def test_jobs_debug_refuses_a_job_that_is_not_a_debug_job_or_has_ended(
    api: ThreadedDouble, tmp_path: Path
) -> None:
    handle = records.handle(JOB_ID, "b", "gke", namespace=NS, k8s_name=JOB)
    backend = GkeBackend(api.double.client_factory())
    with pytest.raises(CliError, match=f"job {JOB_ID} is not a debug job .*debug=True"):
        debug_session(handle, backend, LocalStore(str(tmp_path)), None, io.StringIO())
    # A debug job that has ended (here: gone) has nothing to attach to.
    gone = handle.evolve(debug=True, debug_port=PORT)
    with pytest.raises(CliError, match=f"debug job {JOB_ID} has ended .*nothing to attach to"):
        debug_session(gone, backend, LocalStore(str(tmp_path)), None, io.StringIO())
    assert api.sent("GET", "/portforward") == []
