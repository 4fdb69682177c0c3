"""Issue 21's first-hour breakages, each through real Airflow ``dag.test()`` runs on the
embedded local backend (DAGs: ``tests/dags/kinetic_first_hour_dags.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
import pytest

from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.deferral import release_on_defer

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")
DAGS = "kinetic_first_hour_dags.py"


def test_partial_and_bound_method_tasks_defer_without_xcom_not_found_errors(
    load_dag, capfd, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """A ``functools.partial`` and a bound method run as deferred tasks with their bound
    arguments; Airflow's end-of-segment link push (on deferral and on success) finds
    every link without asking the API for an XCom never pushed (each miss was an
    ``[error] XCom not found`` line)."""
    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")  # defer at once
    dag = load_dag(DAGS, "kinetic_first_hour_callables")
    release = tmp_path / "release"  # each job holds until its task has deferred
    seen = release_on_defer(monkeypatch, release)
    dr = dag.test(logical_date=LOGICAL, run_conf={"release_dir": str(release)})
    out = "".join(capfd.readouterr())
    assert seen == {"partial_add", "bound_greet"}, out[-5000:]  # both were deferred
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", (states, out[-5000:])
    values = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert values["partial_add", "return_value"] == 42
    assert values["bound_greet", "return_value"] == "hello, kinetic"
    assert "KineticJobTrigger" in out, out[-3000:]  # both were deferred
    assert "XCom not found" not in out, out[-5000:]
    for task in ("partial_add", "bound_greet"):
        job = values[task, "kinetic_job"]
        # The job link keeps its URL (the end-of-segment push did not blank it).
        assert values[task, "kinetic_job_link"] == f"/kinetic/jobs/{job['job_id']}"
        assert job["func_name"] == {"partial_add": "add", "bound_greet": "greet"}[task]


def _tries(dr) -> dict[str, tuple[int, int]]:
    """{task_id: (try_number, max_tries)} of a DAG run, as Airflow recorded them."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dr.dag_id, TaskInstance.run_id == dr.run_id
        )
        return {r.task_id: (r.try_number, r.max_tries) for r in rows}


def test_map_default_args_retries_are_the_tasks_and_input_retries_the_inputs(
    load_dag, airflow_home
):
    """``default_args={"retries": 2}`` is the map task's Airflow retries (as on every
    operator); ``input_retries=1`` re-runs each failed input within the one try."""
    dag = load_dag(DAGS, "kinetic_first_hour_map_retries")
    sweep = dag.get_task("sweep")
    assert (sweep.retries, sweep.input_retries) == (2, 1)
    dr = dag.test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
    assert _tries(dr) == {"sweep": (1, 2)}  # one try, two Airflow retries allowed
    values = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert values["sweep", "return_value"] == [-1, -2, -3]
    batch = values["sweep", "kinetic_batch"]
    manifest = airflow_home / "kinetic" / "_groups" / batch["group_id"] / "manifest.json"
    children = json.loads(manifest.read_text())["children"]
    # Every input failed once and ran again inside the same try: input_retries.
    assert {c["group_index"]: c["attempts"] for c in children} == {0: 2, 1: 2, 2: 2}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_op_kwargs_over_the_payload_cap_fail_before_anything_is_uploaded(
    load_dag, airflow_home, capfd, monkeypatch: pytest.MonkeyPatch
):
    """2 MiB of ``op_kwargs`` over a 1 MiB ``[kinetic] max_payload_mb`` fail a run task
    and a map task before any upload, naming the argument, the sizes, the option and
    ``Data``; a task that failed before its job existed logs no ``XCom not found``."""
    monkeypatch.setenv("AIRFLOW__KINETIC__MAX_PAYLOAD_MB", "1")
    store = airflow_home / "kinetic"
    before = _files(store)
    dr = load_dag(DAGS, "kinetic_first_hour_big_kwargs").test(logical_date=LOGICAL)
    out = "".join(capfd.readouterr())
    assert {t: s for (t, _), s in task_states(dr).items()} == {"run": "failed", "sweep": "failed"}
    assert out.count("PayloadTooLargeError") >= 2, out[-5000:]
    for part in (
        "is 2.0 MiB, over the 1 MiB cap ([kinetic] max_payload_mb = 1)",
        "Largest: op_kwargs['blob'] 2.0 MiB",
        "pass large data as Data(path) instead",
        "AIRFLOW__KINETIC__MAX_PAYLOAD_MB",
    ):
        assert out.count(part) >= 2, (part, out[-5000:])
    assert _files(store) - before == set()  # no payload, context, record or job
    assert "XCom not found" not in out, out[-5000:]
