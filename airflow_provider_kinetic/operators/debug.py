"""The operators' debug mode (``debug=True``, ``debug_port``, ``debug_wait``).

Checked when the DAG is parsed: a bad value, or debug mode on a map (whose children
would each wait for a debugger of their own), fails the import naming why.  Once the
job exists the task log says exactly how to attach (``airflow kinetic jobs debug``).
The job side is ``core.spec.debug`` (its pod) and ``runner.debug`` (the wait).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_kinetic.core.spec.debug import DebugSettings, check_debug
from airflow_provider_kinetic.core.spec.handles import JobHandle

log = logging.getLogger(__name__)

#: Capacity kinds whose machines may go away (or come late) under a debugging session.
_FLEETING = ("spot", "flex-start")
DEBUG_PARAMS = ("debug", "debug_port", "debug_wait")


def check(op: Any, debug: Any, debug_port: Any, debug_wait: Any) -> DebugSettings:
    """The task's debug settings (checked now, at parse time); a warning when the job
    may run on spot or flex-start VMs, which can be taken away mid-session."""
    settings = check_debug(debug, debug_port, debug_wait)
    if settings.on:
        capacity = op.capacity if isinstance(op.capacity, list | tuple) else [op.capacity]
        fleeting = [str(c) for c in capacity if str(c) in _FLEETING]
        if op.spot or ":spot" in str(op.accelerator):
            fleeting.insert(0, "spot")
        if fleeting:
            log.warning(
                "task %s: debug=True with %s capacity: the VM may be reclaimed (or start "
                "late) while a debugger is attached",
                op.task_id,
                " / ".join(dict.fromkeys(fleeting)),
            )
    return settings


def refuse_on_map(kwargs: Mapping[str, Any]) -> None:
    """KineticMapOperator takes no debug options: naming why, at parse time."""
    given = [name for name in DEBUG_PARAMS if name in kwargs]
    if given:
        raise ValueError(
            f"KineticMapOperator does not take {', '.join(given)}: debug mode stops a job "
            "until one debugger attaches, and a map runs many children at once; debug "
            "one input with KineticRunOperator(debug=True) instead"
        )


def announce(op: Any, handle: JobHandle) -> None:
    """Say in the task log how to attach to the debug job ``handle``."""
    settings: DebugSettings = op.debug_settings
    if not settings.on:
        return
    where = (
        f"it listens on 127.0.0.1:{settings.port} (this machine only)"
        if handle.backend == "local"
        else f"a port-forward to its pod brings it to 127.0.0.1:{settings.port}"
    )
    op.log.info(
        "kinetic debug job %s waits up to %gs (debug_wait) for a debugger before it runs "
        "the function: run `airflow kinetic jobs debug %s` (%s; it prints VS Code's "
        "launch.json), then attach",
        handle.job_id,
        settings.wait_s,
        handle.job_id,
        where,
    )
