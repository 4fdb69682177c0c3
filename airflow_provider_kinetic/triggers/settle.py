"""Why a trigger holds its event until a while after its task deferred.

When a task defers, its worker process exits and the executor reports that exit
("success") to the scheduler; Airflow's task supervisor may notice the exit only at
its next wake-up, up to ``[workers] min_heartbeat_interval`` (5 s) later.  If the
trigger's event reaches the scheduler first, the task instance is scheduled/queued
again when that late report arrives, and Airflow fails the task for a state
mismatch (apache/airflow#66374, #71580; seen here with `airflow standalone` 3.3: the
report came 5 s after the deferral, just after the event).  So a trigger yields
nothing before ``not_before`` (epoch seconds): the deferral time plus that interval
plus a margin, computed once where the trigger is made (the deferring worker) and
carried in its kwargs.  Jobs that end sooner than the operator's watch before
deferring (``operators.run.DEFER_GRACE_S``) never reach a trigger; a batch trigger
gathers the children that end meanwhile into one event.
"""

from __future__ import annotations

import asyncio
import time

#: Seconds beyond the supervisor's wake-up interval for the report to be processed.
MARGIN_S = 3.0


def settle_s() -> float:
    """Seconds after a deferral before a trigger's event may fire."""
    from airflow.providers.common.compat.sdk import conf

    return conf.getfloat("workers", "min_heartbeat_interval", fallback=5.0) + MARGIN_S


def not_before_from(value: float | None) -> float:
    """``value`` when the trigger is re-created from its kwargs, else now + settle_s()."""
    return time.time() + settle_s() if value is None else float(value)


def remaining(not_before: float) -> float:
    return max(0.0, not_before - time.time())


async def hold(not_before: float) -> None:
    """Sleep until ``not_before`` (no-op once it has passed)."""
    wait = remaining(not_before)
    if wait > 0:
        await asyncio.sleep(wait)
