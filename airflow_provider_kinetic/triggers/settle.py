"""Why a trigger holds its event until a moment after its task deferred.

When a task defers, its worker process exits and the executor later reports that
exit ("success") to the scheduler.  If the trigger's event reaches the scheduler
first, the task instance is already scheduled/queued again when that late report
arrives, and Airflow fails the task for a state mismatch (apache/airflow#66374,
#71580; seen here with local jobs that end within a second of deferring).  So a
trigger yields nothing before ``not_before`` (epoch seconds), which is set once,
when the trigger is made in the deferring worker, and travels in its kwargs.  Jobs
that end sooner than that are mostly collected before deferring
(``operators.run.DEFER_GRACE_S``); a batch trigger gathers the children that end
meanwhile into one event.
"""

from __future__ import annotations

import asyncio
import time

#: Seconds after the deferral before a trigger's event may fire.
SETTLE_S = 3.0


def not_before_from(value: float | None) -> float:
    """``value`` when the trigger is re-created from its kwargs, else now + SETTLE_S."""
    return time.time() + SETTLE_S if value is None else float(value)


def remaining(not_before: float) -> float:
    return max(0.0, not_before - time.time())


async def hold(not_before: float) -> None:
    """Sleep until ``not_before`` (no-op once it has passed)."""
    wait = remaining(not_before)
    if wait > 0:
        await asyncio.sleep(wait)
