"""LeaderWorkerSet (multi-host) jobs: each host finishes once and never runs again.

A LeaderWorkerSet restarts a host whose container exits (and recreates its group),
so each host records its outcome as an empty marker object beside the result
(``finished-<host>-ok`` or ``-failed``).  Before running, a host checks them: any
host's failure makes it fail at once, its own success makes it idle.  After a
success it idles with the readiness probe's file written instead of exiting.
``remote.main`` does this when ``$KINETIC_LWS`` is ``1`` (the LeaderWorkerSet
manifest sets it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

from airflow_provider_kinetic.core.storage import store_for_uri
from airflow_provider_kinetic.runner.invocation import host_index, parse_args

log = logging.getLogger("kinetic.runner")

LWS_ENV = "KINETIC_LWS"
#: manifests.FINISHED_FILE, the readiness probe's file (tests point it elsewhere).
FINISHED_FILE_ENV = "KINETIC_FINISHED_FILE"


def _markers(argv: list[str]) -> tuple[Any, str]:
    """The job's store and the key prefix of its per-host finish markers."""
    store, key = store_for_uri(parse_args(argv).result_gcs)
    return store, key.rsplit("/", 1)[0] + "/finished-"


def lws_earlier_outcome(argv: list[str]) -> str | None:
    """``"failed"`` when any host of this job already failed, ``"ok"`` when this host
    already succeeded, else None (a first start, or a restart before finishing)."""
    store, prefix = _markers(argv)
    names = store.list(prefix)
    if any(n.endswith("-failed") for n in names):
        return "failed"
    return "ok" if f"{prefix}{host_index()}-ok" in names else None


def lws_record_outcome(argv: list[str], code: int) -> None:
    store, prefix = _markers(argv)
    store.write_bytes(f"{prefix}{host_index()}-{'ok' if code == 0 else 'failed'}", b"")


def idle_finished() -> None:
    """Signal completion (readiness probe) and stay up until the job is deleted."""
    with open(os.environ.get(FINISHED_FILE_ENV, "/tmp/kinetic-finished"), "w") as f:
        f.write("0")
    log.info("finished; idling so the LeaderWorkerSet does not restart this host")
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        signal.pause()
