"""Cancel a trigger's jobs when a user kills its task, on every supported Airflow.

Airflow 3.3+ calls ``BaseTrigger.on_kill()`` when a user marks a deferred task
failed/success or clears it, and never on a triggerer restart or hand-over, so the
triggers cancel their jobs there.  Airflow 3.1/3.2 have no such hook: they only
cancel the trigger's ``run()`` and then call ``cleanup()`` - for user kills and
restarts alike.  :class:`CancelOnUserKill` tells the two apart in ``cleanup()`` the
way the triggerer itself does: a restarted or handed-over trigger's task instance is
still ``deferred`` (asked through the Task SDK's supervisor comms, the only API a
triggerer has), a killed one's is not.  Only then does it call ``on_kill()``, so the
cancellation logic stays in one place per trigger.

A trigger that already yielded its event is never cancelled here: its task is
resuming (to collect the result, or to re-defer after an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger

#: Whether this Airflow's triggerer calls ``on_kill()`` for user kills (3.3+).
TRIGGERER_CALLS_ON_KILL = "on_kill" in vars(BaseTrigger)

DEFERRED = "deferred"
#: How long cleanup() may take to cancel after a user kill (3.3: on_kill_timeout, 30 s).
CANCEL_TIMEOUT_S = 30.0


def _noting_events(run: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """Wrap a trigger's ``run()`` so the trigger remembers that it yielded an event."""

    @functools.wraps(run)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with contextlib.aclosing(run(self, *args, **kwargs)) as events:
            async for event in events:
                self._kinetic_event_fired = True
                yield event

    return wrapper


async def task_state(trigger: BaseTrigger) -> str | None:
    """The current state of the trigger's task instance, from the API server.

    Raises when the triggerer gave the trigger no task instance or the API cannot be
    reached; callers treat that as "do not cancel".
    """
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from asgiref.sync import sync_to_async

    ti = getattr(trigger, "task_instance", None)
    if ti is None:
        raise LookupError("the trigger has no task instance")
    states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
        dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
    )
    (state,) = states[ti.run_id].values()  # one task, one map index: one entry
    return state


class CancelOnUserKill:
    """Mixin (before ``BaseTrigger``): ``on_kill()`` on user kills where Airflow has no
    trigger ``on_kill`` (see the module doc).  A subclass's ``run()`` is wrapped so the
    mixin knows whether an event was yielded."""

    _kinetic_event_fired = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__:
            cls.run = _noting_events(cls.__dict__["run"])  # type: ignore[attr-defined]

    async def cleanup(self) -> None:
        await super().cleanup()  # type: ignore[misc]
        if TRIGGERER_CALLS_ON_KILL or self._kinetic_event_fired:
            return
        # 3.1's triggerer cancels the trigger's task again at every state sync until
        # it has finished, which would abort a cancel half-way: run it as its own task
        # and wait for it through those repeated cancels (bounded, like 3.3's
        # [triggerer] on_kill_timeout).
        work = asyncio.ensure_future(self._cancel_if_user_killed())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_TIMEOUT_S
        while not work.done() and loop.time() < deadline:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({work}, timeout=deadline - loop.time())
        if not work.done():
            work.cancel()

    async def _cancel_if_user_killed(self) -> None:
        trigger: Any = self
        try:
            state = await task_state(trigger)
        except Exception as exc:  # noqa: BLE001 - unknown state: keep the job
            trigger.log.warning("not cancelling: the task's state is unknown (%s)", exc)
            return
        if state == DEFERRED:  # triggerer restart or hand-over: the job lives on
            trigger.log.info("task still deferred (triggerer restart?): job left running")
            return
        trigger.log.info("task is %s (killed by a user): cancelling", state)
        try:
            await trigger.on_kill()
        except Exception:  # noqa: BLE001 - the triggerer drops cleanup() errors silently
            trigger.log.exception("cancelling after a user kill failed")
