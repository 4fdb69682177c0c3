"""Runs and tasks never share a job, and a later try adopts only the same work.

Each "try" is a real task execution in its own Python process (a fake task instance
with the ids under test), against one real local store; jobs are real local jobs.
Functions count their executions in marker files and block until released, so a
second run or try always meets the first one's job still running.

- Hostile identifiers: run ids with ``:``, ``+``, ``~``, spaces and non-ASCII, task
  ids all non-ASCII.  Every (run, task) gets its own job, record and output dir (the
  old key rule turned them all into ``exp_1`` / ``_``, and the second run adopted the
  first one's job), and ``jobs list`` shows the real ids.
- Fix and clear: a failed map task whose function is fixed (and whose inputs changed)
  runs the new code on the new inputs; a single task killed while its job ran, then
  fixed, cancels the old job instead of adopting it; a plain retry of unchanged work
  still adopts (no child runs twice).
"""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import read_record
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures import task_process
from tests.fixtures.cli import run_cli
from tests.fixtures.local_conn import set_local_conn
from tests.fixtures.task_process import finish
from tests.fixtures.waiting import wait_for

PRELUDE = textwrap.dedent(
    """
    import json, os, sys, time
    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator
    from tests.fixtures.fake_ti import FakeTI

    ARGS = json.loads(sys.argv[1])

    def ti():
        refuse = "return_value" if ARGS.get("refuse_push") else None  # Airflow refusing it
        return FakeTI(
            dag_id="edges", run_id=ARGS["run_id"], task_id=ARGS["task_id"], try_number=ARGS["try"],
            echo=True, refuse=refuse,
        )

    def count(marker):
        with open(marker, "a") as f:
            f.write("ran\\n")
        while os.path.exists(marker + ".hold"):  # the test releases the job
            time.sleep(0.05)  # timing-ok: the job's workload, held until the test releases it
    """
)

RUN_TASK = PRELUDE + textwrap.dedent(
    """
    def work(marker, rid, task):
        count(marker)
        return {"rid": rid, "task": task, "version": VERSION}

    VERSION = ARGS["version"]
    op = KineticRunOperator(
        task_id=ARGS["task_id"], python_callable=work,
        op_args=[ARGS["marker"], ARGS["run_id"], ARGS["task_id"]],
        kinetic_conn_id="kinetic_edges", poll_interval=0.1,
        cleanup="never",  # handles stay: jobs list reads them
    )
    print("RESULT", json.dumps(op.execute({"ti": ti()})), flush=True)
    """
)

MAP_V1 = """
def child(marker, x):
    count(f"{marker}-{x}")
    if x == 2:
        raise ValueError("the bug: input 2 fails")
    return x * 10
"""
MAP_V2 = """
def child(marker, x):
    count(f"{marker}-{x}")
    return x * 100  # the fix
"""
MAP_TASK = textwrap.dedent(
    """
    op = KineticMapOperator(
        task_id=ARGS["task_id"], python_callable=child,
        inputs=[{"marker": ARGS["marker"], "x": x} for x in ARGS["inputs"]],
        kinetic_conn_id="kinetic_edges", poll_interval=0.1, max_concurrent=4,
    )
    print("RESULT", json.dumps(op.execute({"ti": ti()})), flush=True)
    """
)


@pytest.fixture
def root(monkeypatch, tmp_path) -> Path:
    return set_local_conn(monkeypatch, tmp_path / "kinetic", "kinetic_edges", "kinetic_default")


def start(tmp_path: Path, source: str, name: str, **args) -> subprocess.Popen:  # noqa: ANN003
    return task_process.start(tmp_path, source, name, **args)


def runs(marker: Path) -> int:
    return marker.read_text().count("ran") if marker.exists() else 0


def identity(run_id: str, task_id: str) -> dict:
    return {"dag_id": "edges", "run_id": run_id, "task_id": task_id, "map_index": -1}


HOSTILE = [
    ("exp:1", "训练"),
    ("exp+1", "训练"),
    ("exp~1", "训练"),
    ("exp 1", "训练"),
    ("实验 ü", "训练"),
    ("exp:1", "学习"),
]


def test_hostile_run_and_task_ids_each_get_their_own_job(tmp_path, root):
    first_run, first_task = HOSTILE[0]
    marker = tmp_path / "m"
    hold = Path(f"{marker}-0.hold")
    hold.touch()
    procs = [
        start(tmp_path, RUN_TASK, "t0", run_id=first_run, task_id=first_task,
              marker=f"{marker}-0", version=1, **{"try": 1})
    ]  # fmt: skip
    wait_for("the first run's job to run", lambda: runs(Path(f"{marker}-0")) == 1)
    for i, (run_id, task_id) in enumerate(HOSTILE[1:], start=1):
        Path(f"{marker}-{i}.hold").touch()
        procs.append(
            start(tmp_path, RUN_TASK, f"t{i}", run_id=run_id, task_id=task_id,
                  marker=f"{marker}-{i}", version=1, **{"try": 1})
        )  # fmt: skip
    for i in range(1, len(HOSTILE)):  # each of the others runs its own function
        wait_for(f"run {HOSTILE[i]} to run", lambda i=i: runs(Path(f"{marker}-{i}")) == 1)
    for i in range(len(HOSTILE)):
        Path(f"{marker}-{i}.hold").unlink()
    results = [finish(p)[0] for p in procs]
    assert results == [{"rid": r, "task": t, "version": 1} for r, t in HOSTILE]
    assert [runs(Path(f"{marker}-{i}")) for i in range(len(HOSTILE))] == [1] * len(HOSTILE)

    store = LocalStore(str(root))
    records = [read_record(store, identity(r, t), deployment_secret()) for r, t in HOSTILE]
    handles = [JobHandle.from_dict(rec.handle) for rec in records]
    assert len({h.job_id for h in handles}) == len(HOSTILE)
    assert len({h.output_dir for h in handles}) == len(HOSTILE)
    assert [rec.identity for rec in records] == [identity(r, t) for r, t in HOSTILE]
    for h in handles:  # readable where the ids allow it
        assert "/outputs/edges/" in h.output_dir

    listed = run_cli("jobs", "list", "-o", "json")  # kinetic_default: this store
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    shown = {(row["run_id"], row["task_id"]) for row in rows}
    assert shown == set(HOSTILE)


def map_try(tmp_path: Path, name: str, version: str, inputs: list[int], marker: Path, n: int):
    source = PRELUDE + version + MAP_TASK
    return start(tmp_path, source, name, run_id="manual__fix", task_id="sweep",
                 inputs=inputs, marker=str(marker), **{"try": n})  # fmt: skip


def test_a_fixed_and_cleared_map_task_runs_the_new_code_on_the_new_inputs(tmp_path, root):
    marker = tmp_path / "child"
    _, out = finish(map_try(tmp_path, "v1", MAP_V1, [1, 2, 3], marker, 1), ok=False)
    assert "the bug: input 2 fails" in out
    # The user fixes the function; the upstream now yields [5, 6]; the task is cleared.
    value, out = finish(map_try(tmp_path, "v2", MAP_V2, [5, 6], marker, 2))
    assert value == [500, 600]
    assert "ran other work than this try's" in out and "starting a new batch" in out
    counts = {x: runs(Path(f"{marker}-{x}")) for x in (1, 2, 3, 5, 6)}
    assert counts == {1: 1, 2: 1, 3: 1, 5: 1, 6: 1}  # nothing of the old batch re-ran
    # The old batch's record is kept for history.
    superseded = list((root / "_airflow" / "tasks").rglob("superseded/*.json"))
    assert len(superseded) == 1


def test_a_plain_retry_of_unchanged_map_work_adopts_every_child(tmp_path, root):
    marker = tmp_path / "child"
    for x in (1, 2):
        Path(f"{marker}-{x}.hold").touch()
    first = map_try(tmp_path, "v2a", MAP_V2, [1, 2], marker, 1)
    wait_for(
        "both children to run", lambda: runs(Path(f"{marker}-1")) + runs(Path(f"{marker}-2")) == 2
    )
    first.send_signal(signal.SIGKILL)  # the worker dies; the children keep running
    first.wait(30)
    second = map_try(tmp_path, "v2b", MAP_V2, [1, 2], marker, 2)
    store = LocalStore(str(root))
    ident = identity("manual__fix", "sweep")
    wait_for(
        "try 2 to take the batch over",
        lambda: (r := read_record(store, ident, deployment_secret())) and r.try_number == 2,
    )
    for x in (1, 2):
        Path(f"{marker}-{x}.hold").unlink()
    value, out = finish(second)
    assert value == [100, 200] and "same work" in out
    assert runs(Path(f"{marker}-1")) == 1 and runs(Path(f"{marker}-2")) == 1


def test_a_killed_task_fixed_and_cleared_cancels_the_old_job(tmp_path, root):
    marker = tmp_path / "single"
    Path(f"{marker}.hold").touch()
    first = start(tmp_path, RUN_TASK, "s1", run_id="manual__s", task_id="t",
                  marker=str(marker), version=1, **{"try": 1})  # fmt: skip
    wait_for("the job to run", lambda: runs(marker) == 1)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    store = LocalStore(str(root))
    old = read_record(store, identity("manual__s", "t"), deployment_secret()).job
    # The fix: a new version of the DAG's code; the cleared task's next try.
    fixed = RUN_TASK.replace('"version": VERSION}', '"version": VERSION, "fixed": True}')
    second = start(tmp_path, fixed, "s2", run_id="manual__s", task_id="t",
                   marker=str(marker), version=2, **{"try": 2})  # fmt: skip
    wait_for("the new job to run", lambda: runs(marker) == 2)
    Path(f"{marker}.hold").unlink()
    value, out = finish(second)
    assert value == {"rid": "manual__s", "task": "t", "version": 2, "fixed": True}
    assert f"job {old.job_id} (RUNNING) ran other work than this try's" in out
    assert "cancelled it, running the new work" in out
    # The old job was cancelled, and released like any ended job nobody will collect.
    assert history.read(store, old.job_id)["state"] == "CANCELLED"
    assert not (root / ".local-jobs" / old.job_id).exists()


def test_a_result_airflow_refuses_is_kept_and_collected_by_the_retry(tmp_path, root):
    """The push comes before "delivered" and before the artifacts go: a refused push
    fails the try, and the retry collects the same result (the function ran once)."""
    marker = tmp_path / "pushed"
    args = {"run_id": "manual__p", "task_id": "t", "marker": str(marker), "version": 1}
    _, out = finish(start(tmp_path, RUN_TASK, "p1", refuse_push=True, **args, **{"try": 1}), False)
    assert "the API refused the XCom" in out
    store = LocalStore(str(root))
    record = read_record(store, identity("manual__p", "t"), deployment_secret())
    assert record is not None and not record.delivered
    assert (root / record.job.job_id / "result.pkl").exists()
    value, out = finish(start(tmp_path, RUN_TASK, "p2", **args, **{"try": 2}))
    assert value == {"rid": "manual__p", "task": "t", "version": 1}
    assert "finished; collecting its result -> collect" in out
    assert runs(marker) == 1
