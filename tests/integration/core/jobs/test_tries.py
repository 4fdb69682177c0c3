"""No duplicate work, no lost results: every try of a task follows one rule.

Real processes: the task runs in a child Python process that the test SIGKILLs (a
worker dying), the retry runs in another; DAGs run under real Airflow ``dag.test()``.
Executions are counted with marker files written by the function itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.jobs.taskrecord import read_record
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures import preempting
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.local_conn import set_conn
from tests.fixtures.waiting import wait_for

REPO = Path(__file__).resolve().parents[4]
LOGICAL = pendulum.datetime(2026, 11, 22, tz="UTC")

TASK = textwrap.dedent(
    """
    import json, sys
    from airflow_provider_kinetic import KineticRunOperator
    from tests.fixtures.fake_ti import FakeTI

    def work(marker, seconds):
        import os, time
        with open(marker, "a") as f:
            f.write("ran\\n")
        if seconds < 0:  # run until the test releases the job
            while not os.path.exists(marker + ".release"):
                time.sleep(0.05)
        time.sleep(max(seconds, 0))
        return {"answer": 99}

    marker, seconds, try_number = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    op = KineticRunOperator(task_id="t", python_callable=work, op_args=[marker, seconds],
                            kinetic_conn_id="kinetic_local", poll_interval=0.1)
    ti = FakeTI(try_number=try_number, echo=True)
    print("RESULT", json.dumps(op.execute({"ti": ti})), flush=True)
    """
)


def start_try(tmp_path: Path, marker: Path, seconds: float, try_number: int) -> subprocess.Popen:
    script = tmp_path / "task.py"
    script.write_text(TASK)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(script), str(marker), str(seconds), str(try_number)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def jobs(root: Path) -> list[str]:
    """Every job submitted to the store: its history entry outlives the local state
    dir (released once the job's outcome is collected)."""
    return sorted(p.parent.name for p in (root / "history").glob("*/entry.json"))


def kill_mid_job(tmp_path: Path, root: Path, marker: Path, seconds: float) -> str:
    """Try 1: submit, then the worker is SIGKILLed while the job runs."""
    first = start_try(tmp_path, marker, seconds, try_number=1)
    wait_for("the job to start", lambda: marker.exists())
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert first.returncode == -signal.SIGKILL
    (job_id,) = jobs(root)
    return job_id


def finish_try(proc: subprocess.Popen) -> tuple[dict, str]:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(result.split(" ", 1)[1]), out


def test_worker_killed_job_finishes_during_retry_delay_runs_once(tmp_path, local_conn):
    marker = tmp_path / "executions"
    job_id = kill_mid_job(tmp_path, local_conn, marker, seconds=1.0)
    exit_code = local_conn / ".local-jobs" / job_id / "exit_code"
    wait_for("the job to finish while the task waits to retry", exit_code.exists)
    value, out = finish_try(start_try(tmp_path, marker, 1.0, try_number=2))
    assert value == {"answer": 99}
    assert marker.read_text().count("ran") == 1  # the function ran once
    assert jobs(local_conn) == [job_id]  # and no second job exists
    assert f"job {job_id} finished; collecting its result -> collect" in out


def test_worker_killed_job_still_running_is_adopted(tmp_path, local_conn):
    marker = tmp_path / "executions"
    job_id = kill_mid_job(tmp_path, local_conn, marker, seconds=-1)
    second = start_try(tmp_path, marker, -1, try_number=2)
    identity = {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1}
    store = LocalStore(str(local_conn))
    wait_for(
        "try 2 to take the job over",
        lambda: (r := read_record(store, identity, deployment_secret())) and r.try_number == 2,
    )
    Path(str(marker) + ".release").touch()
    value, out = finish_try(second)
    assert value == {"answer": 99} and marker.read_text().count("ran") == 1
    assert jobs(local_conn) == [job_id]
    assert f"adopting still-RUNNING kinetic job {job_id}" in out


def test_a_delivered_result_is_not_collected_again(tmp_path, local_conn):
    """A clear of a task that succeeded means "run it again": a new job."""
    marker = tmp_path / "executions"
    finish_try(start_try(tmp_path, marker, 0, try_number=1))
    value, out = finish_try(start_try(tmp_path, marker, 0, try_number=2))
    assert value == {"answer": 99} and marker.read_text().count("ran") == 2
    assert len(jobs(local_conn)) == 2 and "already delivered its result: run again" in out


def _run(load_dag, dag_id: str):  # noqa: ANN202
    dag = load_dag("kinetic_try_dags.py", dag_id)
    dr = dag.test(logical_date=LOGICAL)
    return dr, {t: s for (t, _), s in task_states(dr).items()}, xcoms(dr)


def test_map_retry_runs_only_the_failed_children_again(load_dag, airflow_home):
    scratch = Path(os.environ["KINETIC_TEST_SCRATCH"])
    for path in scratch.glob("map-retry-*"):
        path.unlink()
    dr, states, x = _run(load_dag, "kinetic_map_resume")
    assert dr.state == "success", states
    assert x[("sweep", "return_value", -1)] == [i * 10 for i in range(6)]
    runs = {i: (scratch / f"map-retry-{i}").read_text().count("run") for i in range(6)}
    assert runs == {0: 1, 1: 2, 2: 1, 3: 1, 4: 2, 5: 1}  # only 1 and 4 ran again
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dr.dag_id, run_id=dr.run_id).one()
        assert ti.try_number == 2  # the task's Airflow retry did it


def test_results_that_do_not_fit_xcom_travel_by_reference(load_dag, airflow_home):
    dr, states, x = _run(load_dag, "kinetic_big_results")
    assert dr.state == "success", states
    refs = {t: x[(t, "return_value", -1)] for t in ("point", "blob", "array")}
    for task_id, ref in refs.items():
        assert set(ref) == {"kinetic_result", "type", "bytes", "sha256"}, task_id
        assert ref["kinetic_result"].endswith("/result.pkl")
    assert refs["point"]["type"].endswith(".Point")
    assert refs["blob"]["type"] == "builtins.bytes" and refs["blob"]["bytes"] > 3 * 1024 * 1024
    assert refs["array"]["type"] == "numpy.ndarray"
    assert x[("use", "return_value", -1)] == {"norm": 5.0, "bytes": 3 * 1024 * 1024, "sum": 66.0}
    assert x[("plain", "return_value", -1)] == {
        "type": "Point",
        "x": 3.0,
        "bytes": 3 * 1024 * 1024,
        "shape": [3, 4],
    }


@pytest.fixture
def preempt_conn(monkeypatch, tmp_path) -> Path:
    preempting.register()
    root = tmp_path / "preempt"
    set_conn(monkeypatch, "kinetic_preempt", {"backend": "preempting", "root": str(root)})
    yield root
    preempting.unregister()


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_preemption_is_retried_without_an_airflow_retry(load_dag, preempt_conn, mode, capfd):
    dag_id = f"kinetic_preempt_{mode}"
    dr, states, x = _run(load_dag, dag_id)
    out = "".join(capfd.readouterr())
    assert dr.state == "success", states
    assert x[("answer", "return_value", -1)] == 42
    first = (preempt_conn / "first-job").read_text()
    assert len(jobs(preempt_conn)) == 2 and first in jobs(preempt_conn)
    handle = JobHandle.from_dict(x[("answer", "kinetic_job", -1)])
    assert handle.job_id != first  # the XCom handle is the job that delivered
    assert f"kinetic job {first} was preempted" in out and "preemption retry 1/2" in out
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dr.dag_id, run_id=dr.run_id).one()
        assert ti.try_number == 1
    identity = {"dag_id": dag_id, "run_id": dr.run_id, "task_id": "answer", "map_index": -1}
    record = read_record(LocalStore(str(preempt_conn)), identity, deployment_secret())
    assert record.preemptions == 1 and record.delivered


def test_artifacts_are_deleted_once_delivered_and_kept_with_cleanup_never(tmp_path, local_conn):
    from airflow_provider_kinetic import KineticRunOperator

    def answer() -> int:
        import os

        out = os.environ["KINETIC_OUTPUT_DIR"]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "model.txt"), "w") as f:
            f.write("kept")
        return 7

    store = LocalStore(str(local_conn))
    for cleanup in ("on_success", "never"):
        op = KineticRunOperator(
            task_id=f"t-{cleanup}", python_callable=answer, kinetic_conn_id="kinetic_local",
            poll_interval=0.1, cleanup=cleanup,
        )  # fmt: skip
        ti = FakeTI(task_id=op.task_id)
        assert op.execute({"ti": ti}) == 7
        handle = JobHandle.from_dict(ti.xcom["kinetic_job"])
        left = store.list(f"{handle.job_id}/")
        if cleanup == "on_success":
            assert left == []
        else:
            assert f"{handle.job_id}/payload.pkl" in left and f"{handle.job_id}/result.pkl" in left
        out = Path(handle.output_dir[len("file://") :])
        assert (out / "model.txt").read_text() == "kept"  # outputs are never touched
    allowed = "cleanup='all': allowed values are 'on_success', 'always', 'never'"
    with pytest.raises(ValueError, match=allowed):
        KineticRunOperator(task_id="bad", python_callable=len, cleanup="all")


def test_deferred_task_log_shows_the_job_log_live_once(load_dag, capfd):
    import re

    dr, states, x = _run(load_dag, "kinetic_live_logs")
    out = "".join(capfd.readouterr())
    assert dr.state == "success", states
    job_id = x[("chatty", "kinetic_job", -1)]["job_id"]
    shown = re.findall(rf"\[{job_id}\] chatty line (\d+)", out)
    # The job outlives the operator's pre-defer watch (DEFER_GRACE_S): its first lines
    # are shown by the operator, the rest by the trigger; every line once, in order.
    assert shown == [str(i) for i in range(14)]
    # Written by the trigger while the task was deferred, before it resumed.
    assert out.index(f"[{job_id}] chatty line 13") < out.index(f"kinetic job {job_id} resumed")


def test_every_test_dag_file_imports_cleanly(airflow_home):
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow < 3.2
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {} and "kinetic_map_resume" in bag.dag_ids


def test_submit_now_wait_later_example(load_dag):
    dag = load_dag("submit_then_wait.py", "submit_then_wait")
    dr = dag.test(logical_date=LOGICAL)
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", states
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    handles = [JobHandle.from_dict(x[(f"submit_{n}", "return_value")]) for n in "abc"]
    assert len({h.job_id for h in handles}) == 3  # three jobs, submitted side by side
    assert x[("wait_b", "return_value")] == {"lr": 0.03, "loss": 0.01}
    assert x[("pick_best", "return_value")] == {"lr": 0.03, "loss": 0.01}
    # The batch variant: submitted now, its results (input order) from the batch sensor.
    assert x[("submit_sweep", "return_value")]["total"] == 3
    assert [r["lr"] for r in x[("wait_sweep", "return_value")]] == [0.1, 0.03, 0.01]
    assert x[("best_of_sweep", "return_value")] == {"lr": 0.03, "loss": 0.01}
