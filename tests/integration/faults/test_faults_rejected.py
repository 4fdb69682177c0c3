"""A submit rejected before its job exists leaves no task record naming that job.

Real parts: ``dag.test()`` runs a task whose requirements the local backend installs
with the real ``uv``, offline from a tmp wheel directory (``KINETIC_LOCAL_FIND_LINKS``).
The first run's directory lacks the package: uv rejects the submit (as an image build
would) after the task has written its record.  Then the wheel appears (the fix) and
the same task runs again: it must behave as a first try (no "earlier try found", no
superseded record) and the store must hold no record naming the rejected job.

Before: the record written just before the submit stayed, naming a job that never
existed, and the next try started from it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.jobs.taskrecord import RECORDS_PREFIX
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.local_conn import set_local_conn
from tests.fixtures.tiny_wheel import write_wheel

LOGICAL = pendulum.datetime(2026, 11, 26, tz="UTC")
RUN_AFTER = pendulum.datetime(2026, 11, 26, 1, tz="UTC")  # the same run each time


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    root = set_local_conn(monkeypatch, tmp_path / "store", "kinetic_faults")
    monkeypatch.setenv("KINETIC_LOCAL_FIND_LINKS", str(tmp_path / "wheels"))
    (tmp_path / "wheels").mkdir()
    return root


def store_records(root: Path) -> dict[str, str]:
    base = root / RECORDS_PREFIX
    return {str(p.relative_to(base)): p.read_text() for p in base.rglob("*.json")}


def logs(capfd, caplog) -> str:  # noqa: ANN001 - pytest fixtures
    """What the run logged, wherever Airflow's logging sent it; consumed."""
    text = "".join(capfd.readouterr()) + caplog.text
    caplog.clear()
    return text


def test_a_rejected_submit_leaves_no_record_and_the_fixed_task_runs_as_a_first_try(
    load_dag, root, tmp_path, capfd, caplog
):
    dag = load_dag("kinetic_fault_dags.py", "kinetic_fault_rejected")
    dr = dag.test(logical_date=LOGICAL, run_after=RUN_AFTER)
    assert dr.state == "failed", task_states(dr)
    out = logs(capfd, caplog)
    assert "kinetic-fault-pkg was not found" in out  # uv's rejection, in the task log
    rejected = re.search(r"could not create job (job-[0-9a-f]+)", out).group(1)
    assert store_records(root) == {}  # no record names the job that never was
    assert not (root / rejected).exists()

    write_wheel(
        tmp_path / "wheels",
        "kinetic-fault-pkg",
        "1.0",
        {"kinetic_fault_pkg.py": "VALUE = 'fixed'\n"},
    )
    dr = dag.test(logical_date=LOGICAL, run_after=RUN_AFTER)
    assert dr.state == "success", task_states(dr)
    out = logs(capfd, caplog)
    assert "earlier try found" not in out  # a first try: nothing from the rejected one
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert x[("needs_pkg", "return_value")] == "fixed"
    records = store_records(root)
    assert len(records) == 1 and "superseded" not in next(iter(records))
    (text,) = records.values()
    assert x[("needs_pkg", "kinetic_job")]["job_id"] in text and rejected not in text


def test_one_object_is_deleted_alone(store):
    """``delete`` (what puts a task's record back) on both stores: one key, no prefix."""
    store.write_bytes("_airflow/tasks/d/r/t/-1.json", b"record")
    store.write_bytes("_airflow/tasks/d/r/t/-1.json.keep", b"other")
    assert store.delete("_airflow/tasks/d/r/t/-1.json") is True
    assert not store.exists("_airflow/tasks/d/r/t/-1.json")
    assert store.exists("_airflow/tasks/d/r/t/-1.json.keep")
    assert store.delete("_airflow/tasks/d/r/t/-1.json") is False
