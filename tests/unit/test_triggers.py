"""Triggers: JSON-only kwargs that re-create them, one event, errors become events."""

from __future__ import annotations

import json
import sys
import time

import pytest

from airflow_provider_kinetic.core.accelerators import parse_accelerator
from airflow_provider_kinetic.core.backends.local import LocalBackend
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


@pytest.mark.parametrize("kind", ["job", "batch"])
def test_no_event_before_the_deferral_has_settled(tmp_path, kind):
    """A job that ends at once still yields its event only ``not_before`` (set when the
    trigger was made, kept through its kwargs), so the scheduler has seen the deferring
    worker's exit first (apache/airflow#66374)."""
    import asyncio

    from airflow_provider_kinetic.triggers.settle import settle_s

    root = str(tmp_path)
    config = config_to_json(KineticConfig(root=root))
    _sleeper(root, "job-00000005", 0)
    made = time.time()
    if kind == "job":
        trigger = KineticJobTrigger(_handle("job-00000005", root), config, poll_interval=0.05)
    else:
        state = records.batch_state(1, {0: "job-00000005"}, root=root).to_dict()
        trigger = KineticBatchTrigger(state=state, config=config, poll_interval=0.05)
    assert settle_s() >= 5.0  # past the supervisor's wake-up interval
    assert made + settle_s() - 0.1 <= trigger.not_before <= time.time() + settle_s()
    _, kwargs = trigger.serialize()
    recreated = type(trigger)(**kwargs)  # as the triggerer re-creates it
    assert recreated.not_before == trigger.not_before
    event = asyncio.run(_first(recreated))
    assert time.time() >= trigger.not_before
    done = event if kind == "job" else event["finished"]["job-00000005"]
    assert done["status"] == "SUCCEEDED"
