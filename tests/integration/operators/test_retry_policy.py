"""The two layers of retries (docs/RETRIES.md, "Failures and retries"), under real
Airflow ``dag.test()`` on the local backend: on Airflow 3.3 a ``retry_policy`` on the
typed exceptions fails a user error at once (one try of its ``retries=3``) while an
infra error (the job killed by a signal) is retried by Airflow and succeeds; on any
version ``retry_on`` alone re-submits the infra failure within one try and never the
user error."""

from __future__ import annotations

from pathlib import Path

import pendulum
import pytest

from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.local_conn import cancel_jobs, set_local_conn

LOGICAL = pendulum.datetime(2026, 11, 27, tz="UTC")


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    root = set_local_conn(monkeypatch, tmp_path / "store", "kinetic_retry_policy")
    yield root
    cancel_jobs(root)


def tries(dr) -> dict[str, int]:  # noqa: ANN001 - a DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dr.dag_id, TaskInstance.run_id == dr.run_id
        )
        return {r.task_id: r.try_number for r in rows}


def runs(marker: Path, which: str) -> int:
    path = Path(f"{marker}.{which}")
    return path.read_text().count("ran") if path.exists() else 0


def test_a_retry_policy_fails_a_user_error_and_retries_an_infra_error(load_dag, root, tmp_path):
    if not hasattr(pytest.importorskip("airflow.sdk"), "ExceptionRetryPolicy"):
        pytest.skip("Airflow before 3.3 has no retry_policy: retry_on alone (the next test)")
    dag = load_dag("kinetic_retry_policy_dags.py", "kinetic_retry_policy")
    marker = tmp_path / "marker"
    dr = dag.test(logical_date=LOGICAL, run_conf={"marker": str(marker)})
    states = task_states(dr)
    assert states[("bug", -1)] == "failed" and states[("flaky_node", -1)] == "success", states
    assert tries(dr) == {"bug": 1, "flaky_node": 2}  # the bug was not re-run; infra was
    assert (runs(marker, "bug"), runs(marker, "node")) == (1, 2)
    assert xcoms(dr)[("flaky_node", "return_value", -1)] == "survived"


def test_retry_on_alone_resubmits_infra_within_the_try(load_dag, root, tmp_path):
    dag = load_dag("kinetic_retry_policy_dags.py", "kinetic_retry_on")
    marker = tmp_path / "marker"
    dr = dag.test(logical_date=LOGICAL, run_conf={"marker": str(marker)})
    states = task_states(dr)
    assert states[("bug", -1)] == "failed" and states[("flaky_node", -1)] == "success", states
    assert tries(dr) == {"bug": 1, "flaky_node": 1}  # one Airflow try each
    assert (runs(marker, "bug"), runs(marker, "node")) == (1, 2)  # one re-submit
    job = xcoms(dr)[("bug", "kinetic_job", -1)]
    assert job["failure"]["class"] == "user_error" and job["failure"]["phase"] == "execute"
