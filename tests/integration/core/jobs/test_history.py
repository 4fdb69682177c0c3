"""Job history and the one cleanup policy, on every path a job can end on.

A real DAG (``tests/dags/kinetic_history_dags.py``) runs once for the module under
``dag.test()`` on the local backend, one task group per cleanup policy, each through its
own connection and store: a sync job, a deferred one (``defer_grace_s = 0``: it defers
at once), one submitted now and collected by a sensor, a batch with a failing child, a
failing job and one whose result travels by reference.  Afterwards each store and the
disk hold exactly what its policy says, and ``jobs list`` / ``jobs logs`` (the CLI's
``main`` called in this process, on the session's Airflow database) still show every
job; ``jobs cleanup`` (on a group of its own, policy ``never``) keeps what an XCom still
needs unless ``--force``, and applies the retention, saying what it deletes with sizes.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.cli import run_cli
from tests.fixtures.local_conn import set_local_conn

LOGICAL = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
TASKS = {"sync", "deferred", "submit", "batch", "big", "failing"}
DAG_ID = "kinetic_history"
POLICIES = ("on_success", "always", "never")
#: the DAG's task groups: one per policy, and ``cleanup`` (policy never) for the
#: ``jobs cleanup`` test to delete from
GROUPS = (*POLICIES, "cleanup")


def cli(conn: str, *args: str) -> Any:
    """``python -m airflow_provider_kinetic.cli ARGS -o json`` (its ``main``, in this
    process: tests/fixtures/cli.py); its JSON output."""
    out = run_cli(*args, "-o", "json", "--conn-id", conn)
    assert out.returncode == 0, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
    return json.loads(out.stdout)


def clis(conn: str, *commands: tuple[str, ...]) -> list[Any]:
    """Several commands' JSON outputs, run in order."""
    return [cli(conn, *args) for args in commands]


def artifact_dirs(root: Path) -> set[str]:
    """Jobs with anything left under ``{job_id}/`` in the store."""
    return {p.name for p in root.glob("job-*") if p.is_dir() and any(p.rglob("*"))}


@dataclass(frozen=True)
class Ran:
    """The module's one DAG run: each group's store root, and the jobs' temp dir."""

    base: Path
    tmp: Path

    def root(self, group: str) -> Path:
        return self.base / group


@pytest.fixture(scope="module")
def ran(load_dag, tmp_path_factory: pytest.TempPathFactory):
    """Run ``kinetic_history`` once; its groups' connections stay set for the module."""
    base = tmp_path_factory.mktemp("history")
    tmp = base / "tmp"
    tmp.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for group in GROUPS:
            set_local_conn(mp, base / group, conn_of(group))
        mp.setenv("TMPDIR", str(tmp))  # the jobs' temp dirs: inspected afterwards
        mp.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")
        mp.setenv("AIRFLOW__KINETIC__MAX_XCOM_RESULT_BYTES", "1000")
        dr = load_dag("kinetic_history_dags.py", DAG_ID).test(logical_date=LOGICAL)
        states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
        expected = {
            f"{group}.{task}": "failed" if task == "failing" else "success"
            for group in GROUPS
            for task in TASKS | {"wait"}
        }
        assert states == expected
        yield Ran(base, tmp)


def conn_of(group: str) -> str:
    return f"kinetic_history_{group}"


def by_task(group: str, rows: list[dict]) -> dict[str, dict]:
    """``jobs list`` rows by task id within the group (every row is the group's)."""
    assert all(r["task_id"].startswith(f"{group}.") for r in rows), rows
    return {r["task_id"].removeprefix(f"{group}."): r for r in rows}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_path_leaves_what_the_policy_says_and_the_history_shows_it(policy, ran: Ran):
    conn, root, tmp = conn_of(policy), ran.root(policy), ran.tmp
    rows = cli(conn, "jobs", "list")
    tasks = by_task(policy, rows)
    assert set(tasks) == TASKS and len(rows) == len(TASKS)  # one row per job / batch
    assert all(tasks[t]["dag_id"] == DAG_ID for t in TASKS)
    for task in ("sync", "deferred", "submit", "big"):
        assert tasks[task]["state"] == "SUCCEEDED", tasks[task]
        assert tasks[task]["kind"] == "job" and tasks[task]["ended_at"]
    assert tasks["failing"]["state"] == "FAILED"
    assert "broken on purpose" in tasks["failing"]["reason"]
    batch = tasks["batch"]
    assert (batch["kind"], batch["state"]) == ("batch", "SUCCEEDED")
    assert "2 succeeded" in batch["reason"] and "1 failed" in batch["reason"]

    # The store: exactly what the policy keeps.
    entry = history.read(LocalStore(str(root)), batch["job_id"])
    children, failed_child = set(entry["child_jobs"]), set(entry["failed_jobs"])
    assert len(children) == 3 and len(failed_child) == 1
    job = {t: tasks[t]["job_id"] for t in TASKS - {"batch"}}
    kept = {
        "on_success": {job["failing"], *failed_child, job["big"]},
        "always": {job["big"]},  # an XCom result reference points at its result
        "never": {*job.values(), *children},
    }[policy]
    assert artifact_dirs(root) == kept
    # The disk: no local job state dir, nothing in the jobs' temp dir (which every
    # group's jobs shared).
    state_dir = root / ".local-jobs"
    assert not state_dir.exists() or list(state_dir.iterdir()) == []
    assert list(tmp.iterdir()) == []

    # Every job's log, after its local state dir went; and the filters.
    (child,) = failed_child
    printed = {"sync": job["sync"], "deferred": job["deferred"], "broken": job["failing"],
               "child 1": child}  # fmt: skip
    *logs, failed, future, recent, other_dag = clis(
        conn,
        *[("jobs", "logs", job_id) for job_id in printed.values()],
        ("jobs", "list", "--state", "failed"),
        ("jobs", "list", "--since", "2099-01-01"),
        ("jobs", "list", "--since", "1h"),
        ("jobs", "list", "--dag-id", "another_dag"),
    )
    for tag, log in zip(printed, logs, strict=True):
        assert f"history-test {tag}" in log["logs"]
    assert [r["task_id"] for r in failed] == [f"{policy}.failing"]
    assert future == []
    assert len(recent) == len(TASKS)
    assert other_dag == []


@pytest.mark.timeout(600)
def test_cleanup_keeps_what_xcoms_need_then_applies_the_retention(ran: Ran, monkeypatch):
    conn, root = conn_of("cleanup"), ran.root("cleanup")  # policy never: everything kept
    store = LocalStore(str(root))
    everything = artifact_dirs(root)

    # --older-than 0s: every ended job, but not the one an XCom result reference needs.
    rows, dry_rows = clis(
        conn, ("jobs", "list"), ("jobs", "cleanup", "--older-than", "0s", "--dry-run")
    )
    job = {t: r["job_id"] for t, r in by_task("cleanup", rows).items()}
    dry = {r["job_id"]: r for r in dry_rows}
    assert set(dry) == everything
    assert dry[job["big"]]["action"].startswith("kept: a result reference in an XCom of")
    assert {r["action"] for k, r in dry.items() if k != job["big"]} == {"would delete"}
    assert all(r["bytes"] > 0 and r["objects"] > 0 for r in dry.values())
    assert artifact_dirs(root) == everything  # a dry run deletes nothing
    done = {r["job_id"]: r["action"] for r in cli(conn, "jobs", "cleanup", "--older-than", "0s")}
    assert artifact_dirs(root) == {job["big"]}
    assert set(done) == everything
    # History outlives all of it, ...
    forced, rows = clis(conn, ("jobs", "cleanup", job["big"], "--force"), ("jobs", "list"))
    assert [(r["job_id"], r["action"]) for r in forced] == [(job["big"], "deleted")]
    assert artifact_dirs(root) == set()
    assert set(by_task("cleanup", rows)) == TASKS

    # ... until its own retention says otherwise.
    monkeypatch.setenv("AIRFLOW__KINETIC__HISTORY_RETENTION_DAYS", "0")
    dry, rows, gone, after = clis(
        conn,
        ("jobs", "cleanup", "--dry-run"),
        ("jobs", "list"),
        ("jobs", "cleanup", "--force"),
        ("jobs", "list"),
    )
    assert {r["what"] for r in dry} == {"history"} and len(dry) == len(TASKS)
    assert len(rows) == len(TASKS)
    assert {(r["what"], r["action"]) for r in gone} == {("history", "deleted")}
    assert after == []
    assert store.list(history.HISTORY_PREFIX + "/") == []  # children's logs went too
