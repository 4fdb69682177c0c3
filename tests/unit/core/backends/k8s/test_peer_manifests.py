"""A job whose runner serves peers (it has the peer token) declares the peer port on
its pod and learns its IP from the downward API, in Jobs and LeaderWorkerSets alike,
and the manifests stay valid Kubernetes (``kubernetes_validate``, strict, as
``test_manifests.py``); a job without a token declares nothing."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest, lws_manifest
from airflow_provider_kinetic.core.spec.peerport import PEER_PORT, SCOPE_ENV, TOKEN_ENV
from tests.unit.core.backends.k8s.test_manifests import K8S_VERSION, lws_validator, make_spec  # noqa: F401

PEERS = {"env": {SCOPE_ENV: "grp-1234"}, "secrets": {TOKEN_ENV: "0" * 64}}


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return container


def test_a_job_with_peers_declares_the_port_and_its_ip() -> None:
    manifest = job_manifest(make_spec("gpu:l4", **PEERS))
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == K8S_VERSION
    container = _container(manifest["spec"]["template"])
    assert container["ports"] == [
        {"name": "kinetic-peer", "containerPort": PEER_PORT, "protocol": "TCP"}
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["KINETIC_PEER_PORT"]["value"] == str(PEER_PORT)
    assert env["KINETIC_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_lws_hosts_with_peers_declare_it_too(lws_validator: Any) -> None:  # noqa: F811
    manifest = lws_manifest(make_spec("tpu:v6e-4x4", **PEERS))
    lws_validator.validate(manifest)
    for key in ("leaderTemplate", "workerTemplate"):
        template = manifest["spec"]["leaderWorkerTemplate"][key]
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        kubernetes_validate.validate({**pod, "template": template}, K8S_VERSION, strict=True)
        assert _container(template)["ports"][0]["name"] == "kinetic-peer"


def test_a_job_without_peers_declares_no_port() -> None:
    # An unsigned job names its scope too (tensor broadcasts need only that) but gets
    # no token, so its runner serves nothing: no port.
    for extra in ({}, {"env": {SCOPE_ENV: "grp-1234"}}):
        container = _container(job_manifest(make_spec("cpu", **extra))["spec"]["template"])
        assert "ports" not in container
        names = {e["name"] for e in container["env"]}
        assert not {"KINETIC_PEER_PORT", "KINETIC_POD_IP"} & names
