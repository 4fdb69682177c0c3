"""A map task's record says what its try really did, so the next try never runs an
input again for a child that is running or a value that was delivered.

Real processes: each try runs ``KineticMapOperator.execute`` in its own Python process
(a fake task instance), killed or terminated where Airflow or the machine would; the
children are real local jobs; the function counts its runs per input in a marker file.

- Mode: a deferrable try watches its batch in the worker first (``defer_grace_s``); a
  worker killed there has not deferred, so its record says SYNC and the retry adopts
  the running children (a DEFERRED record made the retry cancel them as a cleared
  deferred try's and run every input again).
- Value: a try terminated after the batch's values reached XCom and before it
  returned (Airflow deciding it "shouldn't be running anymore") leaves the record
  "delivered" but not "returned", the batch's ended state and its children's results
  in the store: the retry delivers those same values, a failed position
  (``return_exceptions``) included, and no input runs again (the record's "delivered"
  used to make the retry start a new batch, the children's artifacts deleted).
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
from pathlib import Path

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import SYNC, read_record
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures import task_process
from tests.fixtures.task_process import finish, printed
from tests.fixtures.waiting import wait_for

IDENTITY = {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1}

TASK = textwrap.dedent(
    """
    import json, os, signal, sys
    from airflow_provider_kinetic import KineticMapOperator
    from airflow_provider_kinetic.operators import batch_finish
    from tests.fixtures.fake_ti import FakeTI

    ARGS = json.loads(sys.argv[1])

    def work(marker, x):
        import os, time
        with open(marker, "a") as f:
            f.write(f"ran {x}\\n")
        while os.path.exists(marker + ".hold"):  # the test releases the children
            time.sleep(0.05)  # timing-ok: the child's workload, held until the test releases it
        if x == 3:
            raise ValueError("three is not allowed")
        return {"x": x, "tenfold": 10 * x}

    if ARGS.get("terminate_after_delivery"):
        # Airflow terminates the try at its next step after the batch's end (the values
        # are in XCom, the record says delivered, the cleanup policy has run).
        def terminated(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)

        batch_finish.report_usage = terminated

    op = KineticMapOperator(
        task_id="t", python_callable=work,
        inputs=[[ARGS["marker"], x] for x in ARGS["inputs"]],
        return_exceptions=True, kinetic_conn_id="kinetic_local", poll_interval=0.1,
        deferrable=ARGS["deferrable"],
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


def runs(marker: Path) -> list[str]:
    return sorted(marker.read_text().split("\n")[:-1]) if marker.exists() else []


def entries(root: Path) -> list[str]:
    """The history's entries: the batch's, and one per child a cancel was requested for."""
    return sorted(p.parent.name for p in (root / "history").glob("*/entry.json"))


def record(root: Path):  # noqa: ANN201
    return read_record(LocalStore(str(root)), IDENTITY, deployment_secret())


def test_a_worker_killed_before_it_defers_leaves_children_the_retry_adopts(tmp_path, local_conn):
    marker = tmp_path / "executions"
    hold = Path(f"{marker}.hold")
    hold.touch()
    args = {"marker": str(marker), "inputs": [1, 2], "deferrable": True}
    first = start(tmp_path, **args, **{"try": 1})
    wait_for("both children to run", lambda: runs(marker) == ["ran 1", "ran 2"])
    rec = record(local_conn)
    assert rec.kind == "batch" and rec.try_number == 1
    assert rec.mode == SYNC  # watching in the worker, not deferred
    first.send_signal(signal.SIGKILL)  # inside the watch, before any defer
    first.wait(30)
    assert first.returncode == -signal.SIGKILL

    second = start(tmp_path, **args, **{"try": 2})
    wait_for("try 2 to take the batch over", lambda: record(local_conn).try_number == 2)
    hold.unlink()
    value, out = finish(second)
    assert value == [{"x": 1, "tenfold": 10}, {"x": 2, "tenfold": 20}]
    assert runs(marker) == ["ran 1", "ran 2"]  # each input ran once
    assert record(local_conn).group_id == rec.group_id  # the same batch, resumed
    assert "2 running adopted, 0 to (re)submit" in out
    assert entries(local_conn) == [rec.group_id]  # no child cancelled, no second batch


def test_a_try_terminated_after_delivery_leaves_the_values_to_the_retry(tmp_path, local_conn):
    marker = tmp_path / "executions"
    args = {"marker": str(marker), "inputs": [1, 2, 3], "deferrable": False}
    first = start(tmp_path, **args, terminate_after_delivery=True, **{"try": 1})
    out, _ = first.communicate(timeout=180)
    assert first.returncode == -signal.SIGTERM, out
    delivered = printed(out, "XCOM return_value ")  # delivered before the termination
    assert delivered[:2] == [{"x": 1, "tenfold": 10}, {"x": 2, "tenfold": 20}]
    assert delivered[2]["__kinetic_error__"] and "three is not allowed" in delivered[2]["message"]
    rec = record(local_conn)
    assert rec.delivered and not rec.returned
    store = LocalStore(str(local_conn))
    entry = history.read(store, rec.group_id)
    succeeded = sorted(entry["succeeded_children"])
    assert len(succeeded) == 2
    assert all(store.exists(f"{job_id}/result.pkl") for job_id in succeeded)  # held
    assert entry["artifacts"]["state"].startswith("held")

    value, out = finish(start(tmp_path, **args, **{"try": 2}))
    assert value == delivered  # the same values, the failed position's error included
    assert printed(out, "XCOM return_value ") == delivered
    assert runs(marker) == ["ran 1", "ran 2", "ran 3"]  # no input ran again
    assert entries(local_conn) == [rec.group_id]  # and no second batch exists
    assert "collecting the same values again" in out
    rec2 = record(local_conn)
    assert rec2.group_id == rec.group_id and rec2.try_number == 2
    assert rec2.delivered and rec2.returned
    # Returned: now the policy (on_success) deletes the succeeded children's artifacts.
    assert all(store.list(f"{job_id}/") == [] for job_id in succeeded)
    entry = history.read(store, rec.group_id)
    assert entry["state"] == "SUCCEEDED"
    assert entry["artifacts"]["state"].startswith("kept: its failed child jobs")  # input 3's only
