"""Why a trigger holds its event until a while after its task deferred, and when not.

When a task defers, its worker process exits and the executor reports that exit
("success") to the scheduler only after the task's supervisor has noticed it: when the
process closes its sockets a moment before it can be reaped, the supervisor sleeps in
``select`` for up to ``[workers] min_heartbeat_interval`` (5 s) before it looks again
(``supervisor._monitor_subprocess``), and the scheduler reads the report at its next
loop.  If the trigger's event reaches the scheduler first, the task instance is
scheduled, queued or already running again when that late report is processed, and
Airflow fails it for a state mismatch (apache/airflow#66374; seen here with
``airflow standalone`` 3.3: the report came 5 s after the deferral, just after the
event).  Airflow guards only part of that window: 3.1 not at all, 3.2.2 and 3.3 while
the task instance is still ``scheduled`` (#66431); ``queued`` (#67287, #68741) and
``running`` (#71580, #72716) are not guarded by any release this package supports.  So
a trigger yields nothing before ``not_before`` (epoch seconds): the deferral time plus
that interval plus a margin, computed once where the trigger is made (the deferring
worker) and carried in its kwargs.

Except where no executor stands between the task and its trigger: ``dag.test()`` (and
``airflow tasks test``) run the task in-process and then its trigger inline, in the same
process, after the task has returned; nothing reports an exit late, so no hold.  A
deadline is remembered by the process that set it (``not_before_from``), and a trigger
running in that same process (same pid: a forked child does not count) waits for none
(``remaining``).  A triggerer is always another process, so it always holds.

Jobs that end sooner than the operator's watch before deferring (``[kinetic]
defer_grace_s``) never reach a trigger; a batch trigger gathers the children that end
meanwhile into one event.

And except for an event that ends the task (``triggers.end_task``: a succeeded job
with nothing left for a worker, ``TaskSuccessEvent``): it moves the task instance to
success, not back to scheduled, and the scheduler ignores a late exit report of a
finished task instance, so that event is not held.  The hold stays for every event
that resumes the task on a worker (a failure, a value a worker must deliver, asset
events, an output key).
"""

from __future__ import annotations

import asyncio
import os
import time

#: Seconds beyond the supervisor's wake-up interval for the report to be processed.
MARGIN_S = 3.0

#: ``not_before`` values this process set at a deferral, with the pid that set them
#: (a process forked later inherits the set, not the deferral).  One float per
#: deferral made here: a worker defers a task a handful of times.
_SET_HERE: set[tuple[int, float]] = set()


def settle_s() -> float:
    """Seconds after a deferral before a trigger's event may fire."""
    from airflow.providers.common.compat.sdk import conf

    return conf.getfloat("workers", "min_heartbeat_interval", fallback=5.0) + MARGIN_S


def not_before_from(value: float | None) -> float:
    """``value`` when the trigger is re-created from its kwargs, else now + settle_s()
    (remembered: a trigger that runs in this same process needs no hold)."""
    if value is not None:
        return float(value)
    made = time.time() + settle_s()
    _SET_HERE.add((os.getpid(), made))
    return made


def deferred_here(not_before: float) -> bool:
    """Whether this very process made ``not_before`` at a deferral: its trigger runs
    inline (``dag.test()``), with no executor to report the deferring exit late."""
    return (os.getpid(), not_before) in _SET_HERE


def remaining(not_before: float) -> float:
    """Seconds before an event may fire (0 for a trigger in the deferring process)."""
    if deferred_here(not_before):
        return 0.0
    return max(0.0, not_before - time.time())


async def hold(not_before: float) -> None:
    """Sleep until ``not_before`` (no-op once it has passed, or in the deferring process)."""
    wait = remaining(not_before)
    if wait > 0:
        await asyncio.sleep(wait)
