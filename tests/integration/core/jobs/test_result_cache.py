"""``cache=True``: a delivered result of the same work is reused, never a failed one.

Real local backend and real runner subprocesses; the task's function lives in a module
file under the test's tmp dir (by value in the payload, as a DAG file's code is), and
counts its executions in a file.  Jobs are counted by their history entries
(``backend`` not ``cache``: a hit's entry says it came from the cache)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs import history, resultcache
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.exceptions import KineticJobFailed, KineticUserError
from tests.fixtures import task_process
from tests.fixtures.cli import run_cli
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.waiting import wait_for

WORK = """\
import os
import time

def work(runs, x, seed=0, data=None, gate=None):
    with open(runs, "a") as f:
        f.write("ran\\n")
    while gate and os.path.exists(gate):  # held until the test releases it
        time.sleep(0.05)  # timing-ok: the job's workload, held by the test
    if x < 0:
        raise ValueError("negative")
    extra = open(os.path.join(data, "v.txt")).read() if data else ""
    with open(os.path.join(os.environ["KINETIC_OUTPUT_DIR"], "out.txt"), "w") as f:
        f.write(str(x))
    return {"x": x * {factor}, "data": extra}
"""


CONN = ("--conn-id", "kinetic_local", "-o", "json")


def load(tmp_path: Path, factor: int = 2) -> ModuleType:
    """The task's module, written with ``factor`` (the code) and imported."""
    name = f"cachework_{tmp_path.name.replace('-', '_')}_{factor}"
    path = tmp_path / f"{name}.py"
    path.write_text(WORK.replace("{factor}", str(factor)))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(func: Any, run_id: str, **kw: Any) -> tuple[Any, dict[str, Any]]:
    """One task try of ``func`` (run id ``run_id``): its value and its XComs."""
    op_kwargs = kw.pop("op_kwargs")
    op = KineticRunOperator(
        task_id="t",
        python_callable=func,
        op_kwargs=op_kwargs,
        kinetic_conn_id="kinetic_local",
        poll_interval=0.1,
        cache=True,
        **kw,
    )
    ti = FakeTI(run_id=run_id)
    return op.execute({"ti": ti}), ti.xcom


def jobs(root: Path) -> list[dict]:
    """Entries of the jobs that ran (not cache hits)."""
    return [e for e in history.entries(LocalStore(str(root))) if e.get("backend") != "cache"]


def runs(path: Path) -> int:
    return path.read_text().count("ran") if path.exists() else 0


def test_identical_work_hits_and_each_change_misses(tmp_path, local_conn):
    mod, count = load(tmp_path), tmp_path / "runs"
    data = tmp_path / "data"
    data.mkdir()
    (data / "v.txt").write_text("a")
    args = {"runs": str(count), "x": 3, "data": Data(str(data))}

    first, xc1 = run(mod.work, "r1", op_kwargs=args)
    assert first == {"x": 6, "data": "a"} and xc1["kinetic_cache"]["hit"] is False
    second, xc2 = run(mod.work, "r2", op_kwargs=args)  # another run, the same work
    assert second == first and runs(count) == 1 and len(jobs(local_conn)) == 1
    cache = xc2["kinetic_cache"]
    assert cache["hit"] is True and cache["run_id"] == "r1"
    assert cache["job_id"] == jobs(local_conn)[0]["job_id"]
    assert xc2["output_dir"] == xc1["output_dir"]  # the producer's dir, with its files
    assert Path(xc2["output_dir"].removeprefix("file://"), "out.txt").read_text() == "3"
    (hit,) = [e for e in history.entries(LocalStore(str(local_conn))) if e["backend"] == "cache"]
    assert hit["run_id"] == "r2" and hit["cached_from"]["job_id"] == cache["job_id"]
    assert "from the cache" in hit["reason"]

    # Each change is other work: a miss, a job.
    run(load(tmp_path, factor=3).work, "r3", op_kwargs=args)  # the code
    assert runs(count) == 2
    run(mod.work, "r4", op_kwargs=args, cache_version="2")  # the cache_version
    assert runs(count) == 3
    (data / "v.txt").write_text("b")  # a Data file's contents
    changed, _ = run(mod.work, "r5", op_kwargs={**args, "data": Data(str(data))})
    assert changed == {"x": 6, "data": "b"} and runs(count) == 4
    assert len(jobs(local_conn)) == 4


def test_cache_ignore_hits_across_seeds(tmp_path, local_conn):
    mod, count = load(tmp_path), tmp_path / "runs"
    base = {"runs": str(count), "x": 1}
    run(mod.work, "r1", op_kwargs={**base, "seed": 1}, cache_ignore=["seed"])
    value, xc = run(mod.work, "r2", op_kwargs={**base, "seed": 2}, cache_ignore=["seed"])
    assert xc["kinetic_cache"]["hit"] is True and value == {"x": 2, "data": ""}
    _, xc = run(mod.work, "r3", op_kwargs={**base, "seed": 2})  # seed counts here
    assert xc["kinetic_cache"]["hit"] is False and runs(count) == 2


def test_a_failed_job_is_never_cached(tmp_path, local_conn):
    mod, count = load(tmp_path), tmp_path / "runs"
    args = {"runs": str(count), "x": -1}
    for run_id in ("r1", "r2"):
        with pytest.raises(KineticJobFailed):
            run(mod.work, run_id, op_kwargs=args)
    store = LocalStore(str(local_conn))
    assert runs(count) == 2 and resultcache.entries(store) == []
    assert not store.list(resultcache.CACHE_PREFIX + "/")  # no claim left either


def test_cached_result_survives_cleanup_within_retention_and_goes_after(
    tmp_path, local_conn, airflow_home
):
    mod, count = load(tmp_path), tmp_path / "runs"
    args = {"runs": str(count), "x": 2}
    run(mod.work, "r1", op_kwargs=args)
    store = LocalStore(str(local_conn))
    (entry,) = resultcache.entries(store)
    assert store.exists(f"{entry.job_id}/result.pkl")  # on_success kept it: the entry holds it

    out = run_cli("jobs", "cleanup", "--older-than", "0s", *CONN)
    assert out.returncode == 0, out.stderr
    (row,) = [r for r in json.loads(out.stdout) if r["job_id"] == entry.job_id]
    assert row["action"].startswith("kept: cache entry"), row
    listed = run_cli("cache", "ls", *CONN)
    assert [r["job_id"] for r in json.loads(listed.stdout)] == [entry.job_id]
    _, xc = run(mod.work, "r2", op_kwargs=args)
    assert xc["kinetic_cache"]["hit"] is True and runs(count) == 1
    listed = json.loads(run_cli("jobs", "list", *CONN).stdout)
    assert {(r["run_id"], r["kind"], r["state"]) for r in listed} == {
        ("r1", "job", "SUCCEEDED"),
        ("r2", "cache", "SUCCEEDED"),
    }
    used = json.loads(run_cli("usage", *CONN).stdout)
    assert used["total"]["attempts"] == 1  # the hit ran nothing

    expired = {"AIRFLOW__KINETIC__CACHE_RETENTION_DAYS": "0"}
    out = run_cli("jobs", "cleanup", *CONN, env=expired)
    assert out.returncode == 0, out.stderr
    assert resultcache.entries(store) == [] and not store.exists(f"{entry.job_id}/result.pkl")
    _, xc = run(mod.work, "r3", op_kwargs=args)
    assert xc["kinetic_cache"]["hit"] is False and runs(count) == 2


def test_cache_rm_drops_an_entry(tmp_path, local_conn, airflow_home):
    mod, count = load(tmp_path), tmp_path / "runs"
    run(mod.work, "r1", op_kwargs={"runs": str(count), "x": 5})
    store = LocalStore(str(local_conn))
    (entry,) = resultcache.entries(store)
    out = run_cli("cache", "rm", entry.key[:10], *CONN)
    assert out.returncode == 0, out.stderr
    assert resultcache.entries(store) == [] and not store.exists(f"{entry.job_id}/result.pkl")
    bad = run_cli("cache", "rm", "ffff", "--conn-id", "kinetic_local")
    assert bad.returncode == 1 and "no entry" in bad.stderr


TASK = textwrap.dedent(
    """
    import importlib.util, json, sys
    from airflow_provider_kinetic import KineticRunOperator
    from tests.fixtures.fake_ti import FakeTI

    args = json.loads(sys.argv[1])
    spec = importlib.util.spec_from_file_location(args["module"], args["path"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[args["module"]] = module
    spec.loader.exec_module(module)
    op = KineticRunOperator(task_id="t", python_callable=module.work, op_kwargs=args["kw"],
                            kinetic_conn_id="kinetic_local", poll_interval=0.1, cache=True)
    ti = FakeTI(run_id=args["run_id"])
    value = op.execute({"ti": ti})
    print("RESULT", json.dumps({"value": value, "cache": ti.xcom["kinetic_cache"]}), flush=True)
    """
)


def test_two_concurrent_identical_tasks_run_one_job(tmp_path, local_conn):
    mod, count, gate = load(tmp_path), tmp_path / "runs", tmp_path / "gate"
    gate.touch()
    kw = {"runs": str(count), "x": 4, "gate": str(gate)}
    where = {"module": mod.__name__, "path": mod.__file__, "kw": kw}
    procs = [
        task_process.start(tmp_path, TASK, f"task{i}", run_id=f"r{i}", **where) for i in (1, 2)
    ]
    store = LocalStore(str(local_conn))
    wait_for("one job to run", lambda: runs(count) == 1)
    wait_for("its claim to name it", lambda: (c := _claim(store)) and c.job_id)
    gate.unlink()
    results = [task_process.finish(p)[0] for p in procs]
    assert [r["value"] for r in results] == [{"x": 8, "data": ""}] * 2  # type: ignore[index]
    assert sorted(r["cache"]["hit"] for r in results) == [False, True]  # type: ignore[index]
    assert runs(count) == 1 and len(jobs(local_conn)) == 1


def _claim(store: LocalStore) -> resultcache.Claim | None:
    keys = [k for k in store.list(resultcache.CACHE_PREFIX + "/") if k.endswith(".claim")]
    if not keys:
        return None
    return resultcache.read_claim(store, keys[0].rsplit("/", 1)[1].removesuffix(".claim"))


def test_a_map_rerun_with_one_new_input_runs_one_child(tmp_path, local_conn):
    mod, count = load(tmp_path), tmp_path / "runs"

    def sweep(run_id: str, xs: list[int]) -> tuple[Any, dict[str, Any]]:
        op = KineticMapOperator(
            task_id="m",
            python_callable=mod.work,
            inputs=[{"x": x} for x in xs],
            op_kwargs={"runs": str(count), "seed": int(run_id[1:])},
            kinetic_conn_id="kinetic_local",
            poll_interval=0.1,
            deferrable=False,
            cache=True,
            cache_ignore=["seed"],
        )
        ti = FakeTI(task_id="m", run_id=run_id)
        return op.execute({"ti": ti}), ti.xcom

    first, xc1 = sweep("r1", [1, 2, 3])
    assert [v["x"] for v in first] == [2, 4, 6] and runs(count) == 3
    again, xc2 = sweep("r2", [1, 2, 3, 4])
    assert [v["x"] for v in again] == [2, 4, 6, 8]
    assert runs(count) == 4  # one child: the new input
    assert [c["hit"] for c in xc2["kinetic_cache"]] == [True, True, True, False]
    assert xc2["kinetic_output_dirs"][:3] == xc1["kinetic_output_dirs"]  # the producers'
    (batch,) = [e for e in history.entries(LocalStore(str(local_conn))) if e["run_id"] == "r2"]
    assert len(batch["child_jobs"]) == 1 and sorted(batch["cache_hits"]) == ["0", "1", "2"]
    every, xc3 = sweep("r3", [4, 1])  # every input cached: no child at all
    assert [v["x"] for v in every] == [8, 2] and runs(count) == 4
    assert all(c["hit"] for c in xc3["kinetic_cache"])


def test_when_the_first_of_two_identical_tasks_fails_the_other_runs_its_own(tmp_path, local_conn):
    """The first task runs in a worker process; the second here, once the first's job
    runs (it waits for that job, then runs its own: the first's failed)."""
    mod, count, gate = load(tmp_path), tmp_path / "runs", tmp_path / "gate"
    gate.touch()
    kw = {"runs": str(count), "x": -4, "gate": str(gate)}  # x < 0: the function raises
    first = task_process.start(
        tmp_path, TASK, "task1", run_id="r1", module=mod.__name__, path=mod.__file__, kw=kw
    )
    wait_for("the first task's job to run", lambda: runs(count) == 1)
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(run, mod.work, "r2", op_kwargs=kw)
        gate.unlink()
        out = task_process.finish(first, ok=False)[1]
        with pytest.raises(KineticUserError):  # never a failed result taken
            second.result(timeout=180)
    assert "KineticUserError" in out  # the function raised: a user error (issue 39)
    store = LocalStore(str(local_conn))
    assert runs(count) == 2 and resultcache.entries(store) == []
    assert not store.list(resultcache.CACHE_PREFIX + "/")  # no claim left either


def test_a_clear_keeps_the_cached_result_even_under_cleanup_always(tmp_path, local_conn):
    mod, count = load(tmp_path), tmp_path / "runs"
    args = {"runs": str(count), "x": 7}
    run(mod.work, "r1", op_kwargs=args, cleanup="always")
    value, xc = run(mod.work, "r1", op_kwargs=args, cleanup="always")  # the task cleared
    assert value == {"x": 14, "data": ""} and xc["kinetic_cache"]["hit"] is True
    (entry,) = resultcache.entries(LocalStore(str(local_conn)))
    assert LocalStore(str(local_conn)).exists(f"{entry.job_id}/result.pkl") and runs(count) == 1


def test_a_deferred_task_offers_its_result_when_it_resumes(tmp_path, local_conn, monkeypatch):
    """The claim outlives the deferral; the resumed try (``execute_complete``, a new
    try object) finishes the job, makes the entry and lets the claim go."""
    from airflow.providers.common.compat.sdk import TaskDeferred

    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")  # defer at once
    mod, count = load(tmp_path), tmp_path / "runs"
    op = KineticRunOperator(
        task_id="t",
        python_callable=mod.work,
        op_kwargs={"runs": str(count), "x": 9},
        kinetic_conn_id="kinetic_local",
        poll_interval=0.1,
        deferrable=True,
        cache=True,
    )
    context = {"ti": FakeTI(run_id="r1")}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    store = LocalStore(str(local_conn))
    assert _claim(store) is not None  # held while the triggerer waits

    async def first_event() -> Any:
        async for event in deferred.value.trigger.run():
            return event.payload

    value = op.execute_complete(context, asyncio.run(first_event()))
    assert value == {"x": 18, "data": ""}
    assert len(resultcache.entries(store)) == 1 and _claim(store) is None
    _, xc = run(mod.work, "r2", op_kwargs={"runs": str(count), "x": 9})
    assert xc["kinetic_cache"]["hit"] is True and runs(count) == 1


def test_an_entry_whose_dir_a_later_job_of_its_run_emptied_is_not_reused(tmp_path, local_conn):
    mod, count = load(tmp_path), tmp_path / "runs"
    args = {"runs": str(count), "x": 3}
    run(mod.work, "r1", op_kwargs=args)
    run(load(tmp_path, factor=3).work, "r1", op_kwargs=args)  # r1 cleared with new code
    _, xc = run(mod.work, "r2", op_kwargs=args)  # r1's first entry: its dir was emptied
    assert xc["kinetic_cache"]["hit"] is False and runs(count) == 3
