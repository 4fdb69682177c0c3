"""Debug mode (``debug=True``): the names the operator, the pod and the runner agree on.

A debug job's runner starts a debugpy server on ``KINETIC_DEBUG_PORT`` (loopback only:
on GKE it is reached through a port-forward to the pod, locally on this machine),
writes :data:`READY_NAME` into the job's dir, waits up to ``KINETIC_DEBUG_WAIT_S`` for a
client and then calls the function; no client in time fails the job (phase
``debugger setup``).  kinetic 0.0.4 switches its own debug mode on with
``KINETIC_DEBUG=1``, which is never set here, so its runner ignores these variables.

The pod of a debug job declares the port (``containerPort`` named ``debugpy``, never a
Service) and stays :data:`DEBUG_TTL_S` after it ends (kinetic's two hours).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

#: debugpy's (and VS Code's attach configuration's) default port.
DEFAULT_DEBUG_PORT = 5678
#: How long the runner waits for a client by default (seconds).
DEFAULT_DEBUG_WAIT_S = 1800.0
#: A debug job's ``ttlSecondsAfterFinished`` (kinetic's: two hours).
DEBUG_TTL_S = 7200
PORT_ENV = "KINETIC_DEBUG_PORT"
WAIT_ENV = "KINETIC_DEBUG_WAIT_S"
#: The container port's name, and the label that marks a debug job's pods.
PORT_NAME = "debugpy"
DEBUG_LABEL = "kinetic-debug"
#: Written by the runner into the job's dir once the server listens (JSON:
#: host, port, pid, wait_s); ``airflow kinetic jobs debug`` reads it.
READY_NAME = ".debug_ready"
#: Where the job's code sits in a pod (``localRoot`` -> this in VS Code's pathMappings).
POD_CODE_ROOT = "/tmp/workspace"


@dataclass(frozen=True)
class DebugSettings:
    """A task's debug mode, checked: ``port`` None means off."""

    port: int | None = None
    wait_s: float = DEFAULT_DEBUG_WAIT_S

    @property
    def on(self) -> bool:
        return self.port is not None


def check_debug(debug: Any, port: Any, wait: Any) -> DebugSettings:
    """``debug``, ``debug_port`` and ``debug_wait`` as :class:`DebugSettings`; a
    ValueError naming the bad value and what is allowed."""
    if not isinstance(debug, bool):
        raise ValueError(f"debug must be True or False, got {debug!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"debug_port must be a TCP port number (1-65535), got {port!r}")
    wait_s = check_wait(wait)
    return DebugSettings(port=port if debug else None, wait_s=wait_s)


def check_wait(wait: Any) -> float:
    """``debug_wait`` (seconds or a ``timedelta``) as positive finite seconds."""
    value = wait.total_seconds() if isinstance(wait, timedelta) else wait
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"debug_wait must be a number of seconds or a timedelta, got {wait!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"debug_wait must be more than 0 seconds, got {wait!r}")
    return float(value)


def debug_env(port: int, wait_s: float) -> dict[str, str]:
    """The env of a debug job's container (``breakpoint()`` stops in the debugger)."""
    return {
        PORT_ENV: str(port),
        WAIT_ENV: f"{wait_s:g}",
        "PYTHONBREAKPOINT": "debugpy.breakpoint",
        # debugpy's note about frozen stdlib modules, not about the job's code
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }


def declare_debug_port(container: dict[str, Any], port: int) -> None:
    """Add the debug port to a pod's container (in place): declared, never a Service."""
    container["ports"] = [
        *container.get("ports", []),
        {"name": PORT_NAME, "containerPort": port, "protocol": "TCP"},
    ]


def launch_json(port: int, local_root: str, remote_root: str) -> dict[str, Any]:
    """VS Code's attach configuration for a debug job listening on ``port`` locally."""
    return {
        "version": "0.2.0",
        "configurations": [
            {
                "name": "Kinetic job",
                "type": "debugpy",
                "request": "attach",
                "connect": {"host": "127.0.0.1", "port": port},
                "pathMappings": [{"localRoot": local_root, "remoteRoot": remote_root}],
                "justMyCode": False,
            }
        ],
    }
