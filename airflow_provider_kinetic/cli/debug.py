"""``airflow kinetic jobs debug JOB``: reach a debug job's debugger (``debug=True``).

The job's runner listens with debugpy on loopback and writes its ready marker into the
job's dir (``runner/debug.py``).  Local backend: the address it listens on is already on
this machine, so it is printed.  GKE: a port-forward to the job's pod through the
Kubernetes API (``core/backends/k8s/portforward.py``) brings it to a local port until
the job ends or Ctrl-C.  Either way VS Code's ``launch.json`` follows, with the path
mapping of the job's code.  A job that is not a debug job is refused.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from argparse import Namespace
from typing import Any, TextIO

from airflow_provider_kinetic.cli.common import CliError, command, output_format
from airflow_provider_kinetic.cli.jobs import _attach
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.spec.debug import (
    DEFAULT_DEBUG_PORT,
    POD_CODE_ROOT,
    READY_NAME,
    launch_json,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle, artifact_key
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

#: Seconds between looks at the job (its ready marker, whether it ended).
POLL_S = 2.0


@command
def jobs_debug(args: Namespace) -> None:
    """Attach-ready: print where the debug job ``JOB`` listens (forwarding it from its
    pod on a cluster) and VS Code's launch.json."""
    job = _attach(args)
    as_json = output_format(args) == "json"
    debug_session(job.handle, job.backend, job.store, args.port, sys.stdout, as_json=as_json)


def debug_session(
    handle: JobHandle,
    backend: Backend,
    store: ObjectStore,
    local_port: int | None,
    out: TextIO,
    stop: threading.Event | None = None,
    poll_s: float = POLL_S,
    as_json: bool = False,
) -> None:
    """Wait for the job's debugpy server, say how to attach and, on a cluster, forward
    a local port to it until the job ends (or ``stop`` is set, or Ctrl-C).  ``as_json``:
    one JSON object (job, address, forwarded pod, launch.json) instead of the text."""
    if not handle.debug:
        raise CliError(
            f"job {handle.job_id} is not a debug job (its task did not set debug=True): "
            "nothing in it waits for a debugger"
        )
    stop = stop or threading.Event()
    ready = _wait_ready(handle, backend, store, out if not as_json else None, stop, poll_s)
    if ready is None:
        return
    port = int(ready.get("port") or handle.debug_port or DEFAULT_DEBUG_PORT)
    code_root = str(ready.get("code_root") or POD_CODE_ROOT)
    if handle.backend == "local":
        said = f"kinetic debug job {handle.job_id}: debugpy listens on 127.0.0.1:{port}"
        _announce(out, as_json, said, handle, port, code_root)
        return
    forward = backend.port_forward(handle, port, port if local_port is None else local_port)  # type: ignore[attr-defined]
    if forward is None:
        raise CliError(f"debug job {handle.job_id} has no pod to forward to (yet)")
    with forward:
        said = (
            f"kinetic debug job {handle.job_id}: forwarding 127.0.0.1:{forward.local_port} -> "
            f"pod {forward.namespace}/{forward.pod} port {port} through the Kubernetes API "
            "(until the job ends; Ctrl-C stops it)"
        )
        pod = f"{forward.namespace}/{forward.pod}"
        _announce(out, as_json, said, handle, forward.local_port, code_root, pod)
        try:
            while not stop.wait(poll_s) and not backend.status(handle).status.is_terminal:
                pass
        except KeyboardInterrupt:
            pass
    if not as_json:
        out.write(f"kinetic debug job {handle.job_id}: port-forward closed\n")


def _wait_ready(
    handle: JobHandle,
    backend: Backend,
    store: ObjectStore,
    out: TextIO | None,
    stop: threading.Event,
    poll_s: float,
) -> dict[str, Any] | None:
    """The job's ready marker, once written; a CliError if the job ends first.  A
    waiting line goes to ``out`` (None: nothing said)."""
    said = False
    while True:
        report = backend.status(handle)
        if report.status.is_terminal:
            raise CliError(
                f"debug job {handle.job_id} has ended ({report.describe()}): nothing to attach to"
            )
        try:
            marker = store.read_bytes(artifact_key(handle.job_id, READY_NAME))
        except ObjectNotFound:
            pass
        else:  # kinetic 0.0.4's runner writes an empty one
            with contextlib.suppress(ValueError):
                return dict(json.loads(marker))
            return {}
        if not said and out is not None:
            out.write(
                f"kinetic debug job {handle.job_id} is {report.describe()}: waiting for its "
                "debugpy server...\n"
            )
            out.flush()
            said = True
        if stop.wait(poll_s):
            return None


def _announce(
    out: TextIO,
    as_json: bool,
    said: str,
    handle: JobHandle,
    port: int,
    code_root: str,
    pod: str | None = None,
) -> None:
    """Where to attach and VS Code's launch.json: text, or one JSON object."""
    config = launch_json(port, "${workspaceFolder}", code_root)
    if as_json:
        address = {"job_id": handle.job_id, "host": "127.0.0.1", "port": port, "pod": pod}
        out.write(json.dumps({**address, "launch": config}) + "\n")
        out.flush()
        return
    out.write(said + "\n")
    out.write(
        "VS Code: put this in .vscode/launch.json, set breakpoints, then Run > Start "
        "Debugging (the job runs its function once attached; detaching lets it finish):\n"
    )
    out.write(json.dumps(config, indent=2) + "\n")
    out.flush()
