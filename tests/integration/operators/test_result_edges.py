"""Results reach Airflow or fail loudly; never a lost or re-run job (real dag.test()).

- A NaN / inf in a result passes ``json.dumps`` but not Airflow's API: it travels as
  a reference, the task succeeds, the job ran once (before: the push failed after the
  artifacts were deleted, and the retry ran the job again).
- ``multiple_outputs`` with one value over the XCom limit: that key (only) becomes a
  reference, the others arrive as they are (before: every key was None).
- A map over no inputs succeeds with ``[]`` and says so (before: the task failed and
  its downstream was upstream_failed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum

from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 23, tz="UTC")


def _run(load_dag, dag_id: str):  # noqa: ANN202
    dag = load_dag("kinetic_edge_dags.py", dag_id)
    dr = dag.test(logical_date=LOGICAL)
    return dr, {t: s for (t, _), s in task_states(dr).items()}, xcoms(dr)


def _runs(name: str) -> int:
    path = Path(os.environ["KINETIC_TEST_SCRATCH"]) / name
    return path.read_text().count("run") if path.exists() else 0


def test_a_nan_result_travels_by_reference_and_the_job_runs_once(load_dag, airflow_home):
    before = _runs("edge-nan")
    dr, states, x = _run(load_dag, "kinetic_edge_nan")
    assert dr.state == "success", states
    ref = x[("train", "return_value", -1)]
    assert (
        set(ref) == {"kinetic_result", "type", "bytes", "sha256"} and ref["type"] == "builtins.dict"
    )
    assert x[("report", "return_value", -1)] == {"acc": 0.5, "loss_is_nan": True}
    assert _runs("edge-nan") == before + 1


def test_multiple_outputs_send_only_the_large_key_by_reference(load_dag, airflow_home):
    dr, states, x = _run(load_dag, "kinetic_edge_multi")
    assert dr.state == "success", states
    assert x[("split", "small", -1)] == 3 and x[("split", "name", -1)] == "run"
    big = x[("split", "big", -1)]
    assert big["key"] == "big" and big["type"] == "builtins.bytes"
    assert x[("use", "return_value", -1)] == {
        "small": 3,
        "big": 2 * 1024 * 1024,
        "ref": ["bytes", "key", "kinetic_result", "sha256", "type"],
        "name": "run",
    }


def test_a_map_over_no_inputs_succeeds_with_an_empty_list(load_dag, airflow_home, capfd):
    dr, states, x = _run(load_dag, "kinetic_edge_empty_map")
    assert dr.state == "success", states
    assert states == {"nothing": "success", "sweep": "success", "after": "success"}
    assert x[("sweep", "return_value", -1)] == [] and x[("after", "return_value", -1)] == 0
    assert _runs("edge-empty") == 0
    assert "no inputs (an empty list): nothing to run" in capfd.readouterr().out
