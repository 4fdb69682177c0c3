"""Debug mode in the runner: a debugpy server, its ready marker, the wait for a client.

Only a job whose env names ``KINETIC_DEBUG_PORT`` (``core.spec.debug``) does any of this.
The server listens on loopback only (in a pod it is reached through a port-forward to
the pod, locally from this machine), the ready marker goes into the job's dir, and the
function is called once a client attached; a client that detaches later lets it run
on.  No client within ``debug_wait`` fails the job in phase ``debugger setup``.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from airflow_provider_kinetic.core.spec.debug import PORT_ENV, READY_NAME, WAIT_ENV
from airflow_provider_kinetic.core.storage import store_for_uri

log = logging.getLogger("kinetic.runner")

PHASE = "debugger setup"
HOST = "127.0.0.1"


class NoDebugger(RuntimeError):
    """No client attached within the job's ``debug_wait``."""


def wanted() -> bool:
    """Whether this job runs in debug mode."""
    return bool(os.environ.get(PORT_ENV))


def wait_for_client(job_dir_uri: str, code_root: str) -> None:
    """Listen, write the ready marker under ``job_dir_uri``, wait for a client (up to
    the job's ``debug_wait``); raises :class:`NoDebugger` when none came.

    ``code_root``: where the job's code was extracted (VS Code's ``remoteRoot``)."""
    port = int(os.environ[PORT_ENV])
    wait_s = float(os.environ.get(WAIT_ENV) or 1800)
    try:
        import debugpy
    except ImportError as exc:
        raise RuntimeError(
            "debug=True needs debugpy in the job's runtime: add 'debugpy' to the "
            "task's requirements (or to its image)"
        ) from exc
    debugpy.listen((HOST, port))
    ready = {"host": HOST, "port": port, "pid": os.getpid(), "wait_s": wait_s,
             "code_root": code_root}  # fmt: skip
    store, key = store_for_uri(f"{job_dir_uri.rstrip('/')}/{READY_NAME}")
    store.write_bytes(key, json.dumps(ready).encode())
    log.info(
        "debugpy listening on %s:%d; waiting up to %gs (debug_wait) for a debugger: "
        "attach with `airflow kinetic jobs debug %s`",
        HOST,
        port,
        wait_s,
        os.environ.get("JOB_ID", "JOB"),
    )
    attached = threading.Event()

    def wait() -> None:
        debugpy.wait_for_client()  # no timeout of its own: a thread, bounded below
        attached.set()

    threading.Thread(target=wait, name="kinetic-debug-wait", daemon=True).start()
    if not attached.wait(wait_s):
        raise NoDebugger(
            f"no debugger attached within debug_wait={wait_s:g}s (port {port}); "
            "raise debug_wait or attach sooner"
        )
    log.info("debugger attached: calling the function")
