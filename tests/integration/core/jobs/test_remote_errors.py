"""A remote exception the client cannot rebuild still arrives: its type name, message
and remote traceback reach the task (deferred and sync) and a map's error entries,
under real ``dag.test()`` on the local backend (tests/dags/kinetic_edge_errors_dags.py).
"""

from __future__ import annotations

import re

import pendulum

from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")
#: The type name the runner records: the DAG module (as the tests import it) + qualname.
TYPE = r"kinetic_test_dag_kinetic_edge_errors_dags\.TwoArgError"


def test_unrebuildable_exception_fails_the_task_with_type_message_and_traceback(
    load_dag, capfd, caplog
):
    dr = load_dag("kinetic_edge_errors_dags.py", "kinetic_edge_errors_run").test(
        logical_date=LOGICAL
    )
    assert dr.state == "failed"
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert states == {"deferred": "failed", "sync": "failed"}
    log = "".join(capfd.readouterr()) + caplog.text
    assert "could not be deserialised" not in log
    for n in (41, 43):
        # The task's error: the remote type name and the function's own message ...
        assert re.search(rf"failed: {TYPE}: E{n}: the disk is on fire", log)
        # ... and the remote traceback, down to the line that raised.
        assert re.search(
            rf"Remote traceback:\nTraceback \(most recent call last\):\n(.+\n)+?"
            rf'.*in raise_two_arg\n +raise TwoArgError\(f"E\{{n\}}", "the disk is on fire"\)\n'
            rf"{TYPE}: E{n}: the disk is on fire",
            log,
        ), log[-4000:]


def test_unrebuildable_exception_in_a_map_with_return_exceptions(load_dag):
    dr = load_dag("kinetic_edge_errors_dags.py", "kinetic_edge_errors_map").test(
        logical_date=LOGICAL
    )
    assert dr.state == "success"
    values = xcoms(dr)[("sweep", "return_value", -1)]
    assert values[0] == 0 and values[2] == 20
    for n in (1, 3):
        entry = values[n]
        assert entry["__kinetic_error__"] is True
        assert entry["message"] == f"E{n}: the disk is on fire", entry
        assert re.fullmatch(TYPE, entry["qualified_type"]) and entry["type"] == "TwoArgError"
        assert entry["traceback"].startswith("Remote traceback:\nTraceback")
        assert "in raise_two_arg" in entry["traceback"]
        assert re.search(rf"{TYPE}: E{n}: the disk is on fire\n?$", entry["traceback"])
