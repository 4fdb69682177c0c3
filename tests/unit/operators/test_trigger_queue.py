"""operators.common.to_trigger_queue: ``[kinetic] trigger_queue`` routes a Kinetic task's
trigger to a triggerer queue through Airflow's own deferral (3.2+ with ``[triggerer]
queues_enabled``), and is a one-time note where Airflow cannot (3.1, or queues off)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_kinetic.operators import common
from airflow_provider_kinetic.operators.common import to_trigger_queue


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: object) -> None:
        self.lines.append(msg % args)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(common, "_QUEUE_NOTED", set())


def test_no_setting_leaves_the_queue(monkeypatch):
    op = SimpleNamespace(queue="default", log=_Log())
    monkeypatch.delenv("AIRFLOW__KINETIC__TRIGGER_QUEUE", raising=False)
    assert to_trigger_queue(op) is None and op.queue == "default" and op.log.lines == []


def test_without_trigger_queues_it_is_noted_once(monkeypatch):
    monkeypatch.setenv("AIRFLOW__KINETIC__TRIGGER_QUEUE", "kinetic-logs")
    monkeypatch.setenv("AIRFLOW__TRIGGERER__QUEUES_ENABLED", "False")
    first, second = SimpleNamespace(queue="q", log=_Log()), SimpleNamespace(queue="q", log=_Log())
    assert to_trigger_queue(first) is None and to_trigger_queue(second) is None
    assert first.queue == second.queue == "q"
    assert len(first.log.lines) == 1 and "queues_enabled" in first.log.lines[0]
    assert second.log.lines == []


def test_airflows_deferral_gives_the_trigger_that_queue(monkeypatch):
    """The real Task SDK deferral (``_defer_task``) sends the trigger to the queue."""
    task_runner = pytest.importorskip("airflow.sdk.execution_time.task_runner")
    if "queue" not in task_runner._defer_task.__code__.co_varnames:
        pytest.skip("this Airflow has no trigger queues (3.1): the note above applies")
    from airflow.sdk.exceptions import TaskDeferred
    from airflow.triggers.base import BaseTrigger

    class Trigger(BaseTrigger):
        def serialize(self):  # noqa: ANN202
            return ("tests.Trigger", {})

        async def run(self):  # noqa: ANN202
            yield None

    monkeypatch.setenv("AIRFLOW__KINETIC__TRIGGER_QUEUE", "kinetic-logs")
    monkeypatch.setenv("AIRFLOW__TRIGGERER__QUEUES_ENABLED", "True")
    op = SimpleNamespace(queue="default", log=_Log())
    assert to_trigger_queue(op) == "kinetic-logs"
    ti = SimpleNamespace(task=op, dag_id="d", task_id="t", run_id="r")
    quiet = SimpleNamespace(info=lambda *a, **k: None)  # structlog-style keywords
    msg, _ = task_runner._defer_task(TaskDeferred(trigger=Trigger(), method_name="m"), ti, quiet)
    assert msg.queue == "kinetic-logs"
