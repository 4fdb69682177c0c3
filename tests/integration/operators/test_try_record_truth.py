"""A try's record says what the try really did, so the next try never runs the function
again for work that is running or a value that was computed.

Real processes: each try runs ``KineticRunOperator.execute`` in its own Python process
(a fake task instance), killed or terminated where Airflow or the machine would; jobs
are real local jobs; the function counts its runs in a marker file.

- Mode: a deferrable try watches its job in the worker first (``defer_grace_s``); a
  worker killed there has not deferred, so its record says SYNC and the retry adopts
  the job (a DEFERRED record made the retry cancel it as a cleared deferred try's and
  run the function again).
- Submit: a worker killed after its job's upload, before its create returned, leaves
  no history entry (nothing is written until the create); ``jobs cleanup`` would
  remove the upload, and the retry removes it and leaves the killed id out of the
  task's attempts (the retry wrote an entry of null fields, "not collected ...
  NOT_FOUND", counted it as an attempt and kept its ``payload.pkl``).
- Value: a try terminated after its value reached XCom and before it returned (Airflow
  deciding it "shouldn't be running anymore") leaves the record "delivered" but not
  "returned" and the job's result in the store: the retry delivers that same value
  (the artifacts used to be deleted already, and the retry ran the job again).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from airflow_provider_kinetic.cli.cleanup import ORPHAN_GRACE_S
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import DEFERRED, SYNC, read_record
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures import task_process
from tests.fixtures.cli import run_cli
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.task_process import finish
from tests.fixtures.waiting import wait_for

IDENTITY = {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1}

TASK = textwrap.dedent(
    """
    import json, os, signal, sys
    from airflow_provider_kinetic import KineticRunOperator
    from airflow_provider_kinetic.operators import task_try
    from tests.fixtures.fake_ti import FakeTI

    ARGS = json.loads(sys.argv[1])

    def work(marker):
        import os, time
        with open(marker, "a") as f:
            f.write("ran\\n")
        while os.path.exists(marker + ".hold"):  # the test releases the job
            time.sleep(0.05)  # timing-ok: the job's workload, held until the test releases it
        return {"answer": 99}

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if ARGS.get("kill_at") == "upload":  # the worker dies after the job's upload
        from airflow_provider_kinetic.core.jobs import submit

        submit.create_job = killed
    elif ARGS.get("kill_at") == "create":  # ... after its handle.json, in the create call
        from airflow_provider_kinetic.core.backends.local.backend import LocalBackend

        LocalBackend.submit = killed

    if ARGS.get("terminate_after_delivery"):
        # Airflow terminates the try at its next step after the job's finish (the value
        # is in XCom, the record says delivered, the cleanup policy has run).
        def terminated(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)

        task_try.report_usage = terminated

    op = KineticRunOperator(
        task_id="t", python_callable=work, op_args=[ARGS["marker"]],
        kinetic_conn_id="kinetic_local", poll_interval=0.1, deferrable=ARGS["deferrable"],
    )
    ti = FakeTI(try_number=ARGS["try"], echo=True)
    print("RESULT", json.dumps(op.execute({"ti": ti})), flush=True)
    """
)


def start(tmp_path: Path, **args) -> subprocess.Popen:  # noqa: ANN003
    # A deferrable try's watch in the worker outlasts the test: it is killed inside it.
    return task_process.start(
        tmp_path, TASK, env={"AIRFLOW__KINETIC__DEFER_GRACE_S": "600"}, **args
    )


def runs(marker: Path) -> int:
    return marker.read_text().count("ran") if marker.exists() else 0


def jobs(root: Path) -> list[str]:
    return sorted(p.parent.name for p in (root / "history").glob("*/entry.json"))


def record(root: Path):  # noqa: ANN201
    return read_record(LocalStore(str(root)), IDENTITY, deployment_secret())


def test_a_worker_killed_before_it_defers_leaves_a_job_the_retry_adopts(tmp_path, local_conn):
    marker = tmp_path / "executions"
    hold = Path(f"{marker}.hold")
    hold.touch()
    first = start(tmp_path, marker=str(marker), deferrable=True, **{"try": 1})
    wait_for("the job to run", lambda: runs(marker) == 1)
    (job_id,) = jobs(local_conn)
    store = LocalStore(str(local_conn))
    running = lambda: (history.read(store, job_id) or {}).get("state") == "RUNNING"  # noqa: E731
    wait_for("try 1 to watch its job RUNNING", running)
    rec = record(local_conn)
    assert rec.job.job_id == job_id and rec.mode == SYNC  # watching in the worker
    first.send_signal(signal.SIGKILL)  # inside the watch, before any defer
    first.wait(30)
    assert first.returncode == -signal.SIGKILL

    second = start(tmp_path, marker=str(marker), deferrable=True, **{"try": 2})
    wait_for("try 2 to take the job over", lambda: record(local_conn).try_number == 2)
    hold.unlink()
    value, out = finish(second)
    assert value == {"answer": 99}
    assert runs(marker) == 1  # the function ran once
    assert jobs(local_conn) == [job_id]  # and no second job exists
    assert f"adopting still-RUNNING kinetic job {job_id}" in out
    assert "belonged to a deferred try" not in out


def test_a_try_that_defers_says_so(monkeypatch, tmp_path, local_conn):
    """The other side: the record says DEFERRED once the try hands its job over."""
    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_kinetic import KineticRunOperator

    def held(release: str) -> int:
        import time

        while not os.path.exists(release):
            time.sleep(0.05)  # timing-ok: the job's workload, until the fixture cancels it
        return 1

    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")  # defer at once
    op = KineticRunOperator(
        task_id="t", python_callable=held, op_args=[str(tmp_path / "never")],
        kinetic_conn_id="kinetic_local", poll_interval=0.1, deferrable=True,
    )  # fmt: skip
    ti = FakeTI()
    with pytest.raises(TaskDeferred):
        op.execute({"ti": ti})
    rec = record(local_conn)
    assert rec.mode == DEFERRED and not rec.delivered
    assert rec.job.job_id == ti.xcom["kinetic_job"]["job_id"]


def test_a_try_terminated_after_delivery_leaves_the_value_to_the_retry(tmp_path, local_conn):
    marker = tmp_path / "executions"
    first = start(
        tmp_path, marker=str(marker), deferrable=False, terminate_after_delivery=True,
        **{"try": 1},
    )  # fmt: skip
    out, _ = first.communicate(timeout=180)
    assert first.returncode == -signal.SIGTERM, out
    assert 'XCOM return_value {"answer": 99}' in out  # delivered before the termination
    (job_id,) = jobs(local_conn)
    rec = record(local_conn)
    assert rec.delivered and not rec.returned
    store = LocalStore(str(local_conn))
    assert store.exists(f"{job_id}/result.pkl")  # kept for a later try
    assert history.read(store, job_id)["artifacts"]["state"].startswith("held")

    value, out = finish(start(tmp_path, marker=str(marker), deferrable=False, **{"try": 2}))
    assert value == {"answer": 99}
    assert 'XCOM return_value {"answer": 99}' in out
    assert runs(marker) == 1  # the function ran once
    assert jobs(local_conn) == [job_id]  # and no second job exists
    assert "collecting the same result again -> collect" in out
    rec = record(local_conn)
    assert rec.delivered and rec.returned and rec.try_number == 2
    # Returned: now the policy (on_success) deletes the job's artifacts.
    assert store.list(f"{job_id}/") == []
    entry = history.read(store, job_id)
    assert entry["state"] == "SUCCEEDED" and entry["artifacts"]["state"] == "deleted"


@pytest.mark.parametrize("kill_at", ["upload", "create"])
def test_a_worker_killed_before_its_create_returned_leaves_nothing_behind(
    tmp_path, local_conn, airflow_home, kill_at
):
    marker = tmp_path / "executions"
    first = start(tmp_path, marker=str(marker), deferrable=False, kill_at=kill_at, **{"try": 1})
    out, _ = first.communicate(timeout=180)
    assert first.returncode == -signal.SIGKILL, out
    (killed,) = [p.name for p in local_conn.glob("job-*")]
    store = LocalStore(str(local_conn))
    left = [f"{killed}/payload.pkl"] + ([f"{killed}/handle.json"] if kill_at == "create" else [])
    assert sorted(store.list(f"{killed}/")) == sorted(left)  # uploaded, never created
    assert record(local_conn).job.job_id == killed  # named before its create
    assert jobs(local_conn) == []  # no history entry: nothing is written until the create
    usage = run_cli("usage", "--conn-id", "kinetic_local")
    assert usage.returncode == 0 and "still running" not in usage.stdout, usage.stdout
    if kill_at == "upload":  # a task never retried: jobs cleanup removes it, once aged
        aged = time.time() - 2 * ORPHAN_GRACE_S
        os.utime(local_conn / killed / "payload.pkl", (aged, aged))
        dry = run_cli("jobs", "cleanup", "--dry-run", "--conn-id", "kinetic_local", "-o", "json")
        assert dry.returncode == 0, dry.stderr
        rows = [r for r in json.loads(dry.stdout) if r["job_id"] == killed]
        assert [(r["what"], r["action"].split(" (")[0]) for r in rows] == [
            ("orphan artifacts", "would delete")
        ], rows

    value, out = finish(start(tmp_path, marker=str(marker), deferrable=False, **{"try": 2}))
    assert value == {"answer": 99} and runs(marker) == 1
    assert store.list(f"{killed}/") == []  # its upload went with it
    (job_id,) = jobs(local_conn)  # the new job only: no entry for the killed one
    assert job_id != killed
    entry = history.read(store, job_id)
    assert entry["state"] == "SUCCEEDED" and entry["dag_id"] == "d" and entry["submitted_at"]
    assert record(local_conn).attempts == [job_id]
    pushed = task_process.printed(out, "XCOM kinetic_usage ")
    assert (pushed["attempts"], pushed["running"]) == (1, 0) and "missing" not in pushed, pushed
    assert [a["job_id"] for a in pushed["attempts_detail"]] == [job_id]
    assert f"job {killed} was never created" in out
