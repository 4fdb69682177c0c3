"""A driven batch trigger stopped in the middle of its work (a triggerer shutting
down, a trigger handed over) saves a state that accounts for every input.

The trigger does its store and cluster work in a thread, which cancelling the
trigger does not stop.  Seen under a real ``airflow standalone`` (a sweep failed
after a triggerer restart): the cancel's save ran beside a launch still in flight,
caught an input taken off the queue but not yet active, and the next trigger, which
starts from that save, never ran it.  Here a launch is held open on a real local
backend while the trigger is cancelled, so the interleaving is certain.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.resume import DrivenSaves, driven_key, load_driven
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.signing import AUTH_HMAC
from airflow_provider_kinetic.core.jobs.submit import create_job
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key_for_job
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from airflow_provider_kinetic.triggers.batch_drive import BatchDriver

INPUTS = 4
#: How long a save is given to start beside the held launch (it must not).
SAVE_CHANCE_S = 2.0


def triple(x: int) -> int:
    return 3 * x


def _deferred(config: KineticConfig) -> BatchState:
    """A planned batch as the map operator defers it: nothing launched yet."""
    store = config.store()
    state, objects, local = plan_batch(
        JobRequest(func=triple, output_dir=store.uri("outputs/stop")), list(range(INPUTS)),
        "single", store, config=config, max_concurrent=2, retries=0, fail_fast=False,
        signing_secret=deployment_secret(),
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    state.driver = "deferral-1"
    return state


def _trigger(config: KineticConfig, state: BatchState) -> KineticBatchTrigger:
    return KineticBatchTrigger(
        state=state.to_dict(), config=config_to_json(config), poll_interval=0.05,
        log_bytes_per_poll=0, not_before=0, drive=True,
    )  # fmt: skip


async def _cancel_when(trigger: KineticBatchTrigger, held: threading.Event, then: Any) -> None:
    """Run the trigger until ``held`` is set, cancel it, call ``then`` (in a thread),
    and wait for the trigger to end (as the triggerer does)."""
    first = asyncio.ensure_future(trigger.run().__anext__())
    await asyncio.to_thread(held.wait, 60)
    first.cancel()
    await asyncio.to_thread(then)
    with pytest.raises(asyncio.CancelledError):
        await first


def test_a_trigger_stopped_mid_launch_saves_every_input_and_launches_no_more(
    config: KineticConfig, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _deferred(config)
    submitted: list[str] = []
    launching, release, save_began = threading.Event(), threading.Event(), threading.Event()
    beside_a_launch: list[bool] = []
    real_submit, real_save = LocalBackend.submit, BatchDriver.save

    def held_submit(self: LocalBackend, spec: Any) -> None:
        submitted.append(spec.job_id)
        launching.set()
        release.wait(60)
        real_submit(self, spec)

    def noted_save(self: BatchDriver, batch: BatchState) -> None:
        beside_a_launch.append(launching.is_set() and not release.is_set())
        save_began.set()
        real_save(self, batch)

    monkeypatch.setattr(LocalBackend, "submit", held_submit)
    monkeypatch.setattr(BatchDriver, "save", noted_save)

    def let_the_launch_end() -> None:
        save_began.wait(SAVE_CHANCE_S)  # a save beside the launch would start here
        release.set()

    asyncio.run(_cancel_when(_trigger(config, state), launching, let_the_launch_end))
    # One save, after the launch in flight ended; no launch after the cancel (the
    # batch allows two at once, the trigger was stopping).
    assert beside_a_launch == [False]
    assert len(submitted) == 1
    saved = load_driven(config.store(), BatchState.from_dict(state.to_dict()), deployment_secret())
    assert {i: h.job_id for i, h in saved.active.items()} == {0: submitted[0]}
    assert saved.queue == [1, 2, 3] and not saved.done

    # The next trigger (the same deferral, a new triggerer) runs the rest: every input
    # once, the held one adopted.
    monkeypatch.undo()
    events = asyncio.run(_events(_trigger(config, state)))
    assert [e.payload["status"] for e in events] == ["finished"]
    final = BatchState.from_dict(events[0].payload["state"])
    assert final.jobs[0] == submitted[0]
    assert all(final.launches[i] == 1 for i in range(INPUTS))
    values, failures = batchoutcomes.gather(
        final, config.store(), result_key=lambda job: result_key_for_job(job, AUTH_HMAC)
    )
    assert failures == {} and values == [3 * i for i in range(INPUTS)]


def test_a_trigger_stopped_while_resuming_saves_nothing(
    config: KineticConfig, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped before it took over the batch, a trigger writes no state: a save of its
    deferral's (older) state would hide what the previous trigger saved."""
    state = _deferred(config)
    resuming, release = threading.Event(), threading.Event()
    real_resume = BatchDriver.resume
    saves: list[int] = []

    def held_resume(self: BatchDriver, batch: BatchState) -> BatchState:
        resuming.set()
        release.wait(60)
        return real_resume(self, batch)

    monkeypatch.setattr(BatchDriver, "resume", held_resume)
    monkeypatch.setattr(BatchDriver, "save", lambda self, batch: saves.append(batch.seq))
    asyncio.run(_cancel_when(_trigger(config, state), resuming, release.set))
    assert saves == []
    assert not config.store().exists(driven_key(state.group_id))


async def _events(trigger: KineticBatchTrigger) -> list[Any]:
    return [event async for event in trigger.run()]


class _NotedLock:
    """A driver's ``busy`` lock that says when someone has to wait for it."""

    def __init__(self, waits: threading.Event) -> None:
        self._lock, self.waits = threading.Lock(), waits

    def __enter__(self) -> _NotedLock:
        if not self._lock.acquire(blocking=False):
            self.waits.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_triggerer_shutting_down_mid_launch_saves_every_input(
    config: KineticConfig, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A triggerer stops by leaving ``asyncio.run``, whose teardown cancels every task
    of the loop: the trigger's, and the task of the driver's work in its thread too.
    That work task ends at once although its thread is still launching a child, so
    the stopping trigger took the step as ended and saved beside the launch: an input
    taken off the queue but not yet active, which the next trigger never ran (a sweep
    failed after a triggerer restart: "inputs[2] (not submitted): not run").  Here a
    launch is held open while the loop is torn down as the triggerer's is; the launch
    ends only once the save has either been written (beside it) or waits for it."""
    state = _deferred(config)
    submitted: list[str] = []
    launching, release, save_reached = threading.Event(), threading.Event(), threading.Event()
    real_submit, real_write = LocalBackend.submit, DrivenSaves.save
    real_for_trigger = BatchDriver.for_trigger

    def held_submit(self: LocalBackend, spec: Any) -> None:
        submitted.append(spec.job_id)
        launching.set()
        assert release.wait(120)
        real_submit(self, spec)

    def noted_write(self: DrivenSaves, batch: BatchState) -> None:
        real_write(self, batch)
        save_reached.set()  # written (beside the launch, if it is still held)

    def noted_driver(config_json: str, backend_: Any, log: Any) -> BatchDriver:
        made = real_for_trigger(config_json, backend_, log)
        made.busy = _NotedLock(save_reached)  # a save that waits for the step says so
        return made

    monkeypatch.setattr(LocalBackend, "submit", held_submit)
    monkeypatch.setattr(DrivenSaves, "save", noted_write)
    monkeypatch.setattr(BatchDriver, "for_trigger", staticmethod(noted_driver))

    def let_the_launch_end() -> None:
        save_reached.wait(120)
        release.set()

    async def triggerer() -> None:
        # The trigger runs until its first launch is held; then the loop is left with
        # the trigger still running, as a stopping triggerer leaves it.
        asyncio.ensure_future(_trigger(config, state).run().__anext__())
        await asyncio.to_thread(launching.wait, 120)
        threading.Thread(target=let_the_launch_end, daemon=True).start()

    asyncio.run(triggerer())
    assert release.is_set() and submitted == [submitted[0]]
    saved = load_driven(config.store(), BatchState.from_dict(state.to_dict()), deployment_secret())
    accounted = set(saved.queue) | set(saved.active) | set(saved.done)
    assert accounted == set(range(INPUTS)), saved.to_dict()
    assert {i: h.job_id for i, h in saved.active.items()} == {0: submitted[0]}

    # The next trigger runs the rest: every input once, the held one adopted.
    monkeypatch.undo()
    events = asyncio.run(_events(_trigger(config, state)))
    final = BatchState.from_dict(events[0].payload["state"])
    assert final.jobs[0] == submitted[0]
    assert all(final.launches[i] == 1 for i in range(INPUTS))
    values, failures = batchoutcomes.gather(
        final, config.store(), result_key=lambda job: result_key_for_job(job, AUTH_HMAC)
    )
    assert failures == {} and values == [3 * i for i in range(INPUTS)]


@pytest.mark.parametrize("created", [True, False], ids=["child-created", "never-created"])
def test_a_trigger_resumed_from_a_save_that_lost_an_input_runs_it_once(
    config: KineticConfig, backend: LocalBackend, caplog: pytest.LogCaptureFixture, created: bool
) -> None:
    """A state saved beside a launch (as before the fix above): input 0 taken off the
    queue, neither active nor done.  The next trigger tells from the input's derived
    job ids whether that launch created its child: it adopts the child, or launches
    the input once; the sweep ends with every value, each input run once."""
    state = _deferred(config)
    store = config.store()
    state.queue, state.launches = [1, 2, 3], {0: 1}
    job = batchlaunch.child_job_id(state.group_id, 0, 1)
    if created:  # the launch went on after the save and made the child
        spec = batchlaunch.child_spec(state, 0, job, config, store, deployment_secret())
        create_job(store, backend, spec, state.template.handle(config, store, spec, 0))
    events = asyncio.run(_events(_trigger(config, state)))
    assert [e.payload["status"] for e in events] == ["finished"]
    final = BatchState.from_dict(events[0].payload["state"])
    assert final.jobs[0] == job and all(final.launches[i] == 1 for i in range(INPUTS))
    second = batchlaunch.child_job_id(state.group_id, 0, 2)
    assert not store.exists(artifact_key(second, "handle.json"))
    values, failures = batchoutcomes.gather(
        final, store, result_key=lambda job: result_key_for_job(job, AUTH_HMAC)
    )
    assert failures == {} and values == [3 * i for i in range(INPUTS)]
    said = "adopted" if created else "launched now"
    assert "had lost track of inputs[0] (neither queued, running nor done)" in caplog.text
    assert said in caplog.text
