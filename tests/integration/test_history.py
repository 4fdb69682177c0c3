"""Job history and the one cleanup policy, on every path a job can end on.

A real DAG (``tests/dags/kinetic_history_dags.py``) runs under ``dag.test()`` on the
local backend: a sync job, a deferred one (``defer_grace_s = 0``: it defers at once),
one submitted now and collected by a sensor, a batch with a failing child, a failing
job and one whose result travels by reference.  Afterwards the store and the disk hold
exactly what the policy says, and ``jobs list`` / ``jobs logs`` (the CLI's ``main``
called in this process, on the session's Airflow database) still show every job;
``jobs cleanup`` keeps what an XCom still needs unless ``--force``, and applies the
retention, saying what it deletes with sizes.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.cli import run_cli

LOGICAL = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
TASKS = {"sync", "deferred", "submit", "batch", "big", "failing"}


def cli(conn: str, *args: str) -> Any:
    """``python -m airflow_provider_kinetic.cli ARGS -o json`` (its ``main``, in this
    process: tests/fixtures/cli.py); its JSON output."""
    out = run_cli(*args, "-o", "json", "--conn-id", conn)
    assert out.returncode == 0, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
    return json.loads(out.stdout)


def artifact_dirs(root: Path) -> set[str]:
    """Jobs with anything left under ``{job_id}/`` in the store."""
    return {p.name for p in root.glob("job-*") if p.is_dir() and any(p.rglob("*"))}


def run(policy: str, load_dag, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "kinetic"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    conn = f"kinetic_history_{policy}"
    extra = {"backend": "local", "root": str(root)}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn.upper()}", json.dumps({"conn_type": "kinetic",
                                                                    "extra": extra}))  # fmt: skip
    monkeypatch.setenv("TMPDIR", str(tmp))  # the jobs' temp dirs: inspected afterwards
    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")
    monkeypatch.setenv("AIRFLOW__KINETIC__MAX_XCOM_RESULT_BYTES", "1000")
    dr = load_dag("kinetic_history_dags.py", conn).test(logical_date=LOGICAL)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    expected = dict.fromkeys(TASKS | {"wait"}, "success") | {"failing": "failed"}
    assert states == expected
    return conn, root, tmp


@pytest.mark.timeout(600)
@pytest.mark.parametrize("policy", ["on_success", "always", "never"])
def test_every_path_leaves_what_the_policy_says_and_the_history_shows_it(
    policy, load_dag, tmp_path, monkeypatch
):
    conn, root, tmp = run(policy, load_dag, tmp_path, monkeypatch)
    rows = cli(conn, "jobs", "list")
    by_task = {r["task_id"]: r for r in rows}
    assert set(by_task) == TASKS and len(rows) == len(TASKS)  # one row per job / batch
    assert all(by_task[t]["dag_id"] == conn for t in TASKS)
    for task in ("sync", "deferred", "submit", "big"):
        assert by_task[task]["state"] == "SUCCEEDED", by_task[task]
        assert by_task[task]["kind"] == "job" and by_task[task]["ended_at"]
    assert by_task["failing"]["state"] == "FAILED"
    assert "broken on purpose" in by_task["failing"]["reason"]
    batch = by_task["batch"]
    assert (batch["kind"], batch["state"]) == ("batch", "SUCCEEDED")
    assert "2 succeeded" in batch["reason"] and "1 failed" in batch["reason"]

    # The store: exactly what the policy keeps.
    entry = history.read(LocalStore(str(root)), batch["job_id"])
    children, failed_child = set(entry["child_jobs"]), set(entry["failed_jobs"])
    assert len(children) == 3 and len(failed_child) == 1
    job = {t: by_task[t]["job_id"] for t in TASKS - {"batch"}}
    kept = {
        "on_success": {job["failing"], *failed_child, job["big"]},
        "always": {job["big"]},  # an XCom result reference points at its result
        "never": {*job.values(), *children},
    }[policy]
    assert artifact_dirs(root) == kept
    # The disk: no local job state dir, nothing in the jobs' temp dir.
    state_dir = root / ".local-jobs"
    assert not state_dir.exists() or list(state_dir.iterdir()) == []
    assert list(tmp.iterdir()) == []

    # Every job's log, after its local state dir went.
    for task in ("sync", "deferred", "failing"):
        text = cli(conn, "jobs", "logs", job[task])["logs"]
        assert f"history-test {'broken' if task == 'failing' else task}" in text
    (child,) = failed_child
    assert "history-test child 1" in cli(conn, "jobs", "logs", child)["logs"]

    # Filters.
    assert [r["task_id"] for r in cli(conn, "jobs", "list", "--state", "failed")] == ["failing"]
    assert cli(conn, "jobs", "list", "--since", "2099-01-01") == []
    assert len(cli(conn, "jobs", "list", "--since", "1h")) == len(TASKS)
    assert cli(conn, "jobs", "list", "--dag-id", "another_dag") == []


@pytest.mark.timeout(600)
def test_cleanup_keeps_what_xcoms_need_then_applies_the_retention(load_dag, tmp_path, monkeypatch):
    conn, root, _ = run("never", load_dag, tmp_path, monkeypatch)
    store = LocalStore(str(root))
    job = {r["task_id"]: r["job_id"] for r in cli(conn, "jobs", "list")}
    everything = artifact_dirs(root)

    # --older-than 0s: every ended job, but not the one an XCom result reference needs.
    dry = {r["job_id"]: r for r in cli(conn, "jobs", "cleanup", "--older-than", "0s",
                                       "--dry-run")}  # fmt: skip
    assert set(dry) == everything
    assert dry[job["big"]]["action"].startswith("kept: a result reference in an XCom of")
    assert {r["action"] for k, r in dry.items() if k != job["big"]} == {"would delete"}
    assert all(r["bytes"] > 0 and r["objects"] > 0 for r in dry.values())
    assert artifact_dirs(root) == everything  # a dry run deletes nothing
    done = {r["job_id"]: r["action"] for r in cli(conn, "jobs", "cleanup", "--older-than", "0s")}
    assert artifact_dirs(root) == {job["big"]}
    assert set(done) == everything
    forced = cli(conn, "jobs", "cleanup", job["big"], "--force")
    assert [(r["job_id"], r["action"]) for r in forced] == [(job["big"], "deleted")]
    assert artifact_dirs(root) == set()

    # History outlives all of it, until its own retention says otherwise.
    assert {r["task_id"] for r in cli(conn, "jobs", "list")} == TASKS
    monkeypatch.setenv("AIRFLOW__KINETIC__HISTORY_RETENTION_DAYS", "0")
    dry = cli(conn, "jobs", "cleanup", "--dry-run")
    assert {r["what"] for r in dry} == {"history"} and len(dry) == len(TASKS)
    assert len(cli(conn, "jobs", "list")) == len(TASKS)
    gone = cli(conn, "jobs", "cleanup", "--force")
    assert {(r["what"], r["action"]) for r in gone} == {("history", "deleted")}
    assert cli(conn, "jobs", "list") == []
    assert store.list(history.HISTORY_PREFIX + "/") == []  # children's logs went too
