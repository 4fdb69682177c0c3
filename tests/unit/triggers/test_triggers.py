"""Triggers: JSON-only kwargs that re-create them, one event, errors become events."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from airflow_provider_kinetic.triggers.job import KineticJobTrigger
from tests.fixtures import records


def _handle(job_id: str, root: str) -> dict:
    return records.handle(job_id, root).to_dict()


def _sleeper(root: str, job_id: str, seconds: float) -> None:
    """Launch a local 'job' whose command just sleeps (no runner needed)."""
    spec = build_job_spec(
        SpecInputs(
            job_id=job_id,
            bucket=root,
            context_uri="c",
            payload_uri="p",
            result_uri="r",
            payload_sha256="0",
            context_sha256="0",
            accelerator=parse_accelerator("cpu"),
            image="i",
            output_dir=root,
            runner_command=[sys.executable, "-c", f"import time; time.sleep({seconds})"],
        )
    )
    spec.container["args"] = []
    LocalBackend(root).submit(spec)


async def _first(trigger) -> dict:
    events = [e async for e in trigger.run()]
    assert len(events) == 1
    return events[0].payload


class SettleClock:
    """``triggers.settle``'s clock, made exact: frozen at ``NOW``, except that every
    reading moves it on 1 s (a batch trigger re-polls until ``remaining`` is 0) and a
    hold's sleep moves it on by what it sleeps instead of sleeping.  ``seen`` is the
    clock when each event reached the test."""

    NOW = 1_800_000_000.0

    def __init__(self) -> None:
        self.now = self.NOW
        self.seen: list[float] = []

    def time(self) -> float:
        self.now += 1.0
        return self.now - 1.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    async def first(self, trigger) -> dict:
        events = []
        async for event in trigger.run():
            self.seen.append(self.now)
            events.append(event)
        assert len(events) == 1
        return events[0].payload


@pytest.fixture
def clock(monkeypatch) -> SettleClock:
    from airflow_provider_kinetic.triggers import settle

    fake = SettleClock()
    monkeypatch.setattr(settle, "time", fake)
    monkeypatch.setattr(settle, "asyncio", fake)
    return fake


def test_job_trigger_roundtrips_json_and_reports_success(tmp_path):
    root = str(tmp_path)
    _sleeper(root, "job-00000001", 0)
    trigger = KineticJobTrigger(
        _handle("job-00000001", root), config_to_json(KineticConfig(root=root)), poll_interval=0.05
    )
    path, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # JSON only
    assert path == "airflow_provider_kinetic.triggers.job.KineticJobTrigger"
    import asyncio

    event = asyncio.run(_first(KineticJobTrigger(**kwargs)))
    assert event["status"] == "SUCCEEDED" and event["handle"]["job_id"] == "job-00000001"


def test_job_trigger_deadline_and_on_kill(tmp_path):
    import asyncio

    root = str(tmp_path)
    _sleeper(root, "job-00000002", 60)
    handle = _handle("job-00000002", root)
    trigger = KineticJobTrigger(
        handle, config_to_json(KineticConfig(root=root)), poll_interval=0.05, deadline=time.time()
    )
    event = asyncio.run(_first(trigger))
    assert event["status"] == "timeout" and "RUNNING" in event["message"]
    asyncio.run(trigger.on_kill())
    report = LocalBackend(root).status(records.handle("job-00000002", root))
    assert report.status.value == "FAILED" and report.reason == "cancelled"


def test_trigger_errors_become_one_error_event(tmp_path):
    import asyncio

    bad = KineticJobTrigger(
        {"job_id": "job-x", "backend": "gke", "bucket_name": "b"},
        config_to_json(KineticConfig(root=str(tmp_path))),
    )
    event = asyncio.run(_first(bad))
    assert event["status"] == "error" and "project" in event["message"]


def test_batch_trigger_echoes_state(tmp_path):
    import asyncio

    root = str(tmp_path)
    _sleeper(root, "job-00000003", 0)
    state = records.batch_state(2, {0: "job-00000003"}, root=root).to_dict()
    trigger = KineticBatchTrigger(
        state=state, config=config_to_json(KineticConfig(root=root)), poll_interval=0.05
    )
    _, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs
    event = asyncio.run(_first(KineticBatchTrigger(**kwargs)))
    # The state comes back as it went, plus how far each child's log was shown (and
    # whose log is read next: it turns once per poll, so it depends on the timing).
    echoed = event["state"]
    assert isinstance(echoed["log_turn"], int)
    assert event["status"] == "changed"
    assert {**echoed, "log_offsets": {}, "log_turn": state["log_turn"]} == state
    assert echoed["log_offsets"] == {"0": ["job-00000003", 0]}  # the sleeper prints nothing
    assert event["finished"]["job-00000003"]["status"] == "SUCCEEDED"


@pytest.mark.parametrize("extra", [{"backend": "nope"}])
def test_config_rejects_unknown_backend(extra):
    with pytest.raises(ValueError, match="unknown kinetic backend 'nope'; allowed: local, gke"):
        KineticConfig(**extra)


def _in_another_process(func, *args):
    """``func(*args)`` in a forked child process (a worker or a triggerer is never the
    process that runs the other one's code), its JSON result back through a pipe."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=lambda: there.send(json.dumps(func(*args))))
    child.start()
    try:
        assert here.poll(120), "the child process sent nothing"
        return json.loads(here.recv())
    finally:
        child.join(120)


def _made(kind: str, kwargs: dict) -> dict:
    """The kwargs of a trigger made (at deferral) in the calling process."""
    return (KineticJobTrigger if kind == "job" else KineticBatchTrigger)(**kwargs).serialize()[1]


def _trigger_kwargs(kind: str, root: str, job_id: str) -> dict:
    config = config_to_json(KineticConfig(root=root))
    if kind == "job":
        return {"handle": _handle(job_id, root), "config": config, "poll_interval": 0.05}
    state = records.batch_state(1, {0: job_id}, root=root).to_dict()
    return {"state": state, "config": config, "poll_interval": 0.05}


@pytest.mark.parametrize("kind", ["job", "batch"])
def test_no_event_before_the_deferral_has_settled(tmp_path, kind, clock):
    """A job that ends at once still yields its event only ``not_before`` (set when the
    trigger was made, in the deferring worker, kept through its kwargs), so the
    scheduler has seen the deferring worker's exit first (apache/airflow#66374)."""
    from airflow_provider_kinetic.triggers.settle import settle_s

    root = str(tmp_path)
    _sleeper(root, "job-00000005", 0)
    kwargs = _in_another_process(_made, kind, _trigger_kwargs(kind, root, "job-00000005"))
    assert settle_s() >= 5.0  # past the supervisor's wake-up interval
    assert kwargs["not_before"] == clock.NOW + settle_s()  # made at the deferral (NOW)
    recreated = (KineticJobTrigger if kind == "job" else KineticBatchTrigger)(**kwargs)
    assert recreated.not_before == kwargs["not_before"]  # as the triggerer re-creates it
    event = asyncio.run(clock.first(recreated))
    assert clock.seen[0] >= kwargs["not_before"]
    done = event if kind == "job" else event["finished"]["job-00000005"]
    assert done["status"] == "SUCCEEDED"


@pytest.mark.parametrize("kind", ["job", "batch"])
def test_a_trigger_in_the_deferring_process_holds_nothing(tmp_path, kind, monkeypatch, clock):
    """``dag.test()`` runs a task's trigger inline, in the process that deferred it, once
    the task has returned: no executor reports that exit, so nothing can race the
    event, and the event comes as soon as the job ends, long before ``not_before``
    (the hold is made an hour long here, so a hold could not go unseen)."""
    from airflow_provider_kinetic.triggers.settle import deferred_here, remaining

    monkeypatch.setenv("AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL", "3600")
    root = str(tmp_path)
    _sleeper(root, "job-00000006", 0)
    made = (KineticJobTrigger if kind == "job" else KineticBatchTrigger)(
        **_trigger_kwargs(kind, root, "job-00000006")
    )
    _, kwargs = made.serialize()
    recreated = type(made)(**json.loads(json.dumps(kwargs)))  # as dag.test re-creates it
    assert deferred_here(recreated.not_before) and remaining(recreated.not_before) == 0.0
    event = asyncio.run(clock.first(recreated))
    assert clock.seen[0] < recreated.not_before  # no hour-long hold
    done = event if kind == "job" else event["finished"]["job-00000006"]
    assert done["status"] == "SUCCEEDED"
    # The same deadline is held by any other process (a triggerer), a fork included.
    assert _in_another_process(remaining, kwargs["not_before"]) > 0.0
