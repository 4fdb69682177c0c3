"""KineticMapOperator and dynamic task mapping under real Airflow ``dag.test()``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pendulum

from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")
BAD = [5, 42, 77, 150]


def _store(airflow_home: Path) -> Path:
    return airflow_home / "kinetic"


def _manifest(airflow_home: Path, batch: dict) -> dict:
    path = _store(airflow_home) / "_groups" / batch["group_id"] / "manifest.json"
    return json.loads(path.read_text())


def test_map_200_inputs_failures_named(load_dag, airflow_home, capfd, caplog):
    dr = load_dag("kinetic_map_dags.py", "kinetic_map_fail").test(logical_date=LOGICAL)
    assert dr.state == "failed"
    log = "".join(capfd.readouterr()) + caplog.text
    assert "4 of 200 inputs failed" in log
    for i in BAD:
        assert re.search(rf"inputs\[{i}\] \(job-[0-9a-f]{{8}}\): ValueError: input {i} is bad", log)
    batch = xcoms(dr)[("sweep", "kinetic_batch", -1)]
    assert batch["counts"]["succeeded"] == 196 and batch["counts"]["failed"] == 4
    assert batch["counts"]["submitted"] == 200 and batch["counts"]["active"] == 0
    assert re.search(r"submitted \d+/200, active \d, succeeded \d+, failed \d", log)
    manifest = _manifest(airflow_home, batch)
    assert manifest["group_kind"] == "map" and manifest["total_expected"] == 200
    assert [c["group_index"] for c in manifest["children"]] == list(range(200))
    assert manifest["submit_fn_name"] == "square_or_raise"
    # Partial results stay in the store: each successful child's result.pkl and handle.
    child = manifest["children"][7]
    handle = json.loads((_store(airflow_home) / child["job_id"] / "handle.json").read_text())
    assert handle["group_id"] == batch["group_id"] and handle["group_index"] == 7
    assert handle["group_kind"] == "map"
    assert (_store(airflow_home) / child["job_id"] / "result.pkl").exists()


def test_map_return_exceptions_keeps_order(load_dag):
    dr = load_dag("kinetic_map_dags.py", "kinetic_map_return_exc").test(logical_date=LOGICAL)
    assert dr.state == "success"
    values = xcoms(dr)[("sweep", "return_value", -1)]
    assert len(values) == 200
    for i, v in enumerate(values):
        if i in BAD:
            assert v["__kinetic_error__"] and v["type"] == "ValueError"
            assert v["message"] == f"input {i} is bad" and "square_or_raise" in v["traceback"]
        else:
            assert v == i * i


def test_map_retry_recovers_transient_failures(load_dag, airflow_home):
    dr = load_dag("kinetic_map_dags.py", "kinetic_map_retry").test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
    assert xcoms(dr)[("sweep", "return_value", -1)] == [-i for i in range(30)]
    batch = xcoms(dr)[("sweep", "kinetic_batch", -1)]
    attempts = {c["group_index"]: c["attempts"] for c in _manifest(airflow_home, batch)["children"]}
    assert attempts == {i: 2 if i % 10 == 3 else 1 for i in range(30)}


def test_map_fail_fast_cancels_the_rest(load_dag, airflow_home):
    scratch = Path(os.environ["KINETIC_TEST_SCRATCH"])
    dr = load_dag("kinetic_map_dags.py", "kinetic_map_fail_fast").test(logical_date=LOGICAL)
    assert dr.state == "failed"
    batch = xcoms(dr)[("sweep", "kinetic_batch", -1)]
    counts = batch["counts"]
    assert counts["failed"] == 1 and counts["succeeded"] == 0
    assert counts["submitted"] < 12 and counts["not_submitted"] == 12 - counts["submitted"]
    assert counts["cancelled"] == counts["submitted"] - 1
    # No child process is left running.
    for pid_file in scratch.glob("pid-*"):
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, 0)
            alive = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except ProcessLookupError:
            alive = False
        assert not alive, f"child {pid_file.name} (pid {pid}) still running"


def test_mapped_run_operator_and_xcom_inputs(load_dag):
    dr = load_dag("kinetic_map_dags.py", "kinetic_mapped_and_xcom").test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
    x = xcoms(dr)
    assert [x[("each", "return_value", i)] for i in range(5)] == [101, 102, 103, 104, 105]
    jobs = [x[("each", "kinetic_job", i)]["job_id"] for i in range(5)]
    assert len(set(jobs)) == 5
    outs = [x[("each", "output_dir", i)] for i in range(5)]
    assert [o.rsplit("/", 1)[1] for o in outs] == ["0", "1", "2", "3", "4"]
    assert x[("from_xcom", "return_value", -1)] == [101, 5, 9, 106]


def test_empty_inputs_succeed_with_nothing_uploaded(load_dag, airflow_home, capfd, caplog):
    """As Airflow skips an expand() over []: the map succeeds with [] and uploads nothing."""
    groups = _store(airflow_home) / "_groups"
    before = set(groups.iterdir()) if groups.exists() else set()
    dr = load_dag("kinetic_map_dags.py", "kinetic_map_empty").test(logical_date=LOGICAL)
    assert dr.state == "success"
    assert "no inputs (an empty list): nothing to run" in "".join(capfd.readouterr()) + caplog.text
    assert (set(groups.iterdir()) if groups.exists() else set()) == before
