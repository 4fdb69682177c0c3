"""Where a job's runner serves its peers: the names a pod and the runner agree on.

Kept in ``spec`` (below both the backends that declare the port on a pod and the
keys that serve on it), so the names are written once.  On GKE the pod declares
``PEER_PORT`` (named ``kinetic-peer``, so a NetworkPolicy can allow it by name) and
learns its own IP from the downward API; the local backend declares nothing and its
runners take any free loopback port.
"""

from __future__ import annotations

from typing import Any

#: The batch (or job) whose peers may talk to each other (set on every job: a batch
#: child gets its batch's id, an LWS host its job's id), and their shared token
#: (signed jobs only).
SCOPE_ENV = "KINETIC_PEER_SCOPE"
TOKEN_ENV = "KINETIC_PEER_TOKEN"
PORT_ENV = "KINETIC_PEER_PORT"
POD_IP_ENV = "KINETIC_POD_IP"
PEER_PORT = 8471
PEER_PORT_NAME = "kinetic-peer"


def declare_peer_port(container: dict[str, Any]) -> None:
    """Add the peer port and the pod-IP env to a pod's container (in place), when the
    job's runner serves peers at all: every job names a scope, but only a signed job
    gets the token its server asks of every request."""
    env = container.setdefault("env", [])
    if not any(e.get("name") == TOKEN_ENV for e in env):
        return
    container["ports"] = [
        *container.get("ports", []),
        {"name": PEER_PORT_NAME, "containerPort": PEER_PORT, "protocol": "TCP"},
    ]
    env.append({"name": PORT_ENV, "value": str(PEER_PORT)})
    env.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
