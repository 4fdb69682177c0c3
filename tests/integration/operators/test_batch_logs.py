"""Live logs of batch children, and KineticBatchSensor, under real Airflow ``dag.test()``.

Children are real runner subprocesses on the local backend; the task log is what
``dag.test()`` prints.  A live line is told apart from the failure summary's repeat
by the logger name Airflow prints after it (the operator's, or the trigger's).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pendulum
import pytest

from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 21, tz="UTC")
DAGS = "kinetic_batch_logs_dags.py"
OPERATOR, TRIGGER = "airflow.task.operators", "airflow_provider_kinetic.triggers"
LIVE = re.compile(rf"\[child (\d+)\] (.*?) +\[({re.escape(OPERATOR)}|{re.escape(TRIGGER)})[\w.]*\]")


def live_lines(out: str) -> dict[int, list[tuple[str, str]]]:
    """Per child, its live lines in the order shown, each with the logger that showed it."""
    seen: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for index, text, logger in LIVE.findall(out):
        seen[int(index)].append((text, logger))
    return seen


def _x(dr) -> dict[tuple[str, str], object]:
    return {(t, k): v for (t, k, _), v in xcoms(dr).items()}


@pytest.mark.parametrize("mode", ["sync", "deferrable"])
def test_children_lines_appear_prefixed_once_in_order(load_dag, capfd, mode):
    dr = load_dag(DAGS, f"kinetic_batch_logs_{mode}").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)
    assert _x(dr)[("sweep", "return_value")] == [0, 10, 20, 30]
    seen = live_lines(out)
    assert sorted(seen) == [0, 1, 2, 3]
    for child, lines in seen.items():
        chatty = [t for t, _ in lines if t.startswith("chatty ")]
        # Every line of the child once, in order, under its own index (80-byte cap).
        assert chatty == [f"chatty {child}.{j:02d} " + "x" * 20 for j in range(12)], lines
    if mode == "deferrable":
        # The children print after the operator's watch (they start quiet): their
        # lines are shown by the trigger, while deferred (the runner's start-up lines
        # may come earlier, from the operator).
        by_trigger = [
            c
            for c, lines in seen.items()
            if all(g == TRIGGER for t, g in lines if t.startswith("chatty "))
        ]
        assert by_trigger, {c: {g for _, g in lines} for c, lines in seen.items()}
    else:
        assert {g for lines in seen.values() for _, g in lines} == {OPERATOR}


def test_failing_child_last_lines_are_in_the_failure_message(load_dag, capfd):
    dr = load_dag(DAGS, "kinetic_batch_logs_fail").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    assert dr.state == "failed"
    assert "1 of 3 inputs failed" in out and "ValueError: child 1 gave up" in out
    live = [t for t, _ in live_lines(out)[1]]
    assert [t for t in live if t.startswith("context")] == [f"context 1.{j:02d}" for j in range(30)]
    head = "last 20 log lines of inputs[1]:"
    assert head in out
    block = out[out.index(head) + len(head) :].splitlines()[1:21]
    tail = [re.sub(r"^\s*\[child 1\] ", "", line).rstrip() for line in block]
    assert all(line.lstrip().startswith("[child 1] ") for line in block), block
    assert tail == [t.rstrip() for t in live[-20:]]  # the child's last 20 lines, in order
    assert "context 1.29" in tail and "context 1.00" not in tail


def test_return_exceptions_still_logs_the_failed_childs_last_lines(load_dag, capfd):
    """With ``return_exceptions=True`` nothing raises, yet the failed input's error and
    log tail are in the task log (a warning), and its position holds the error."""
    dr = load_dag(DAGS, "kinetic_batch_logs_return_exc").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    assert dr.state == "success"
    values = xcoms(dr)[("sweep", "return_value", -1)]
    assert values[0] == 0 and values[2] == 2 and values[1]["type"] == "ValueError"
    assert "1 of 3 inputs failed" in out and "ValueError: child 1 gave up" in out
    assert "returned as error values" in out
    head = "last 20 log lines of inputs[1]:"
    block = out[out.index(head) + len(head) :].splitlines()[1:21]
    tail = [re.sub(r"^\s*\[child 1\] ", "", line).rstrip() for line in block]
    live = [t for t, _ in live_lines(out)[1]]
    assert tail == [t.rstrip() for t in live[-20:]] and "context 1.29" in tail


@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
def test_batch_sensor_returns_results_in_input_order(load_dag, airflow_home, capfd, mode):
    dr = load_dag(DAGS, f"kinetic_batch_sensor_{mode}").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)
    x = _x(dr)
    handle = x[("submit", "return_value")]
    assert handle["kind"] == "kinetic_batch" and handle["total"] == 5
    # The submitting task started the first two; the sensor launched the rest.
    assert x[("submit", "kinetic_batch")]["counts"]["submitted"] == 2
    assert x[("wait", "return_value")] == [0, 1, 4, 9, 16]
    group = Path(airflow_home) / "kinetic" / "_groups" / handle["group_id"]
    manifest = json.loads((group / "manifest.json").read_text())
    assert [c["group_index"] for c in manifest["children"]] == [0, 1, 2, 3, 4]
    assert (group / "live.json").exists()
    assert re.search(r"\[child 4\] \[kinetic-runner\]", out)  # the sensor shows their logs


def test_batch_sensor_fail_fast_raises_with_partial_results(load_dag, capfd):
    dr = load_dag(DAGS, "kinetic_batch_sensor_fail").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    assert dr.state == "failed"
    assert {t: s for (t, _), s in task_states(dr).items()} == {
        "submit": "success",
        "wait": "failed",
    }
    assert "KineticBatchFailed" in out and "3 of 4 inputs failed" in out
    assert re.search(r"inputs\[1\] \(job-[0-9a-f]{8}\): RuntimeError: odd input 1", out)
    # fail_fast as planned: nothing launched after the first failure.
    assert "inputs[2] (not submitted): RuntimeError: not submitted (fail_fast)" in out
