"""The record says what happened: cancelled, failed, succeeded and resumed jobs and
batches leave history (state, try number, counts, children) that agrees with Airflow,
and ``jobs status / result`` fall back to it once the backend forgot the job.

Real local jobs, operators run in this process as a worker would (``FakeTI``), the
CLI's ``main`` in this process (``tests/fixtures/cli.py``), the Kinetic tab's view
function (``plugins.tasks.task_view``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.waiting import wait_for
from tests.integration.cli import test_cli
from tests.integration.cli.test_cli import CONN, DEADLINE_S, as_json, cli

#: A local connection named CONN (``test_cli``'s fixture).
config = test_cli.config

DAG, RUN = "agree", "manual__agree"


def held_unless_low(x: int, release: str) -> int:
    """Inputs 0 and 1 return at once; the others wait for ``release``."""
    import os
    import time

    while x >= 2 and not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the remote job's workload, polling for its release
    return x


def odd_fails_until(x: int, fixed: str) -> int:
    import os

    if x % 2 and not os.path.exists(fixed):
        raise ValueError(f"input {x} is odd")
    return x


def boom() -> None:
    raise RuntimeError("boom")


def add(a: int, b: int) -> int:
    return a + b


def _run(task_id: str, try_number: int = 1, **op: Any) -> Any:
    """One operator run as task ``task_id`` of DAG ``agree`` (sync, in this process)."""
    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator

    ti = FakeTI(dag_id=DAG, task_id=task_id, run_id=RUN, try_number=try_number)
    kind = KineticMapOperator if "inputs" in op else KineticRunOperator
    task = kind(task_id=task_id, kinetic_conn_id=CONN, poll_interval=0.1, **op)
    return task.execute({"ti": ti, "logical_date": None})


def _entry_of(config: KineticConfig, task_id: str) -> dict[str, Any]:
    (entry,) = [e for e in history.entries(config.store()) if e.get("task_id") == task_id]
    return entry


def test_a_sweep_marked_failed_is_cancelled_with_its_children_counted(
    config: KineticConfig, tmp_path: Path
):
    """A deferred sweep (the trigger drives it) whose task is marked failed with two
    children succeeded and two running: the trigger's ``on_kill`` cancels the two;
    the batch's entry says CANCELLED with 2 succeeded, 2 cancelled, lists the four
    children, and no child shows up as a job of its own (no entry without a DAG)."""
    store = config.store()
    identity = {"dag_id": DAG, "task_id": "sweep", "run_id": RUN, "map_index": -1,
                "try_number": 1}  # fmt: skip
    request = JobRequest(
        func=held_unless_low,
        kwargs={"release": str(tmp_path / "release")},
        output_dir=store.uri("outputs/sweep"),
        identity=identity,
    )
    state, objects, local = plan_batch(
        request, [0, 1, 2, 3], "single", store, config=config, max_concurrent=4, retries=0,
        fail_fast=False, signing_secret=deployment_secret(),
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    state.driver = "deferral-1"
    trigger = KineticBatchTrigger(
        state=state.to_dict(), config=config_to_json(config), poll_interval=0.05,
        log_bytes_per_poll=0, not_before=0, drive=True,
    )  # fmt: skip

    def two_done_two_running() -> bool:
        batch = trigger._batch
        done = [i for i, o in batch.done.items() if o == "SUCCEEDED"]
        return sorted(done) == [0, 1] and sorted(batch.active) == [2, 3]

    async def mark_failed() -> None:
        first = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.to_thread(
            wait_for, "two children done, two running", two_done_two_running, DEADLINE_S
        )
        first.cancel()  # the triggerer stops the trigger, then asks it to clean up
        with pytest.raises(asyncio.CancelledError):
            await first
        await trigger.on_kill()

    asyncio.run(mark_failed())
    group = state.group_id
    entry = history.read(store, group)
    assert entry is not None
    assert entry["state"] == "CANCELLED", entry
    assert entry["children"]["succeeded"] == 2 and entry["children"]["cancelled"] == 2
    assert "2 succeeded" in entry["reason"] and "2 cancelled" in entry["reason"]

    rows = as_json("jobs", "list")
    assert [(r["job_id"], r["state"]) for r in rows] == [(group, "CANCELLED")]
    assert all(r["dag_id"] == DAG for r in rows)  # no child listed as a job of its own
    children = [r for r in as_json("jobs", "list", "--children") if r["kind"] == "child"]
    assert sorted((r["child"], r["state"]) for r in children) == [
        (0, "SUCCEEDED"), (1, "SUCCEEDED"), (2, "CANCELLED"), (3, "CANCELLED"),
    ]  # fmt: skip
    assert all(r["dag_id"] == DAG and r["task_id"] == "sweep" for r in children)
    usage = as_json("usage", "--by", "task")
    assert [r["dag_id"] for r in usage["groups"]] == [DAG], usage

    from airflow_provider_kinetic.plugins.tasks import task_view

    view = task_view(CONN, DAG, RUN, "sweep", -1)
    (job,) = view.jobs
    assert job.state == "CANCELLED" and len(job.children) == 4
    assert "still running" not in job.usage_line


def test_a_failed_job_with_kept_artifacts_reports_failed_not_gone(config: KineticConfig):
    """The backend released the failed job (its outcome was collected); its artifacts
    are kept (policy on_success): ``jobs status`` and the next try's decision (what a
    cleared task logs) say FAILED, as its history does, not NOT_FOUND."""
    from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
    from airflow_provider_kinetic.core.jobs.taskrecord import decide_job, read_record
    from airflow_provider_kinetic.operators.common import task_identity

    with pytest.raises(Exception, match="boom"):
        _run("failing", python_callable=boom)
    job_id = _entry_of(config, "failing")["job_id"]
    store = config.store()
    assert store.exists(f"{job_id}/handle.json")  # kept: the job failed

    status = as_json("jobs", "status", job_id)
    assert status["state"] == "FAILED" and "boom" in (status["reason"] or ""), status
    assert "boom" in status["result"] and "kept" in status["result"], status

    ti = FakeTI(dag_id=DAG, task_id="failing", run_id=RUN, try_number=2)
    record = read_record(store, task_identity({"ti": ti}), deployment_secret())
    _, _, report, why = decide_job(record, LocalBackend(config.bucket_name), store)
    assert report is not None and report.status.value == "FAILED", why
    assert f"job {job_id} ended FAILED" in why and "NOT_FOUND" not in why, why


def test_a_resumed_batch_records_the_try_that_ended_it_and_every_child(
    config: KineticConfig, tmp_path: Path
):
    """Try 1: inputs 1 and 3 fail, the batch fails.  Try 2 resumes it (0 and 2 are
    collected, 1 and 3 run again) and succeeds: its entry says SUCCEEDED by try 2, its
    usage counts the six jobs the batch created, and its kept artifacts are named as
    the failed children's, not as "the job failed"."""
    fixed = tmp_path / "fixed"
    op = dict(python_callable=odd_fails_until, op_kwargs={"fixed": str(fixed)},
              inputs=[0, 1, 2, 3], max_concurrent=4)  # fmt: skip
    with pytest.raises(Exception, match="odd"):
        _run("resumed", **op)
    fixed.write_text("")
    assert _run("resumed", try_number=2, **op) == [0, 1, 2, 3]

    entry = _entry_of(config, "resumed")
    group = entry["job_id"]
    assert entry["state"] == "SUCCEEDED" and entry["try_number"] == 2, entry
    assert "failed" not in (entry["reason"] or ""), entry
    artifacts = entry["artifacts"]["state"]
    assert artifacts != "kept: the job failed ([kinetic] failed_retention_days)"
    assert artifacts.startswith(("deleted", "kept: its failed child jobs")), artifacts
    assert entry["usage"]["jobs"] == 6 and len(entry["child_jobs"]) == 6, entry["usage"]

    status = as_json("jobs", "status", group)
    assert status["state"] == "SUCCEEDED" and status["try_number"] == 2
    assert "(try 2)" in status["result"], status
    (row,) = as_json("usage", "--by", "task")["groups"]
    assert row["jobs"] == 6, row

    from airflow_provider_kinetic.plugins.tasks import task_view

    view = task_view(CONN, DAG, RUN, "resumed", -1)
    assert view.try_number == 2 and [j.state for j in view.jobs] == ["SUCCEEDED"]


def test_result_of_a_delivered_cleaned_up_job_says_where_it_went(config: KineticConfig):
    """Its artifacts went with the cleanup (on_success): ``jobs result`` says its value
    was delivered to the task's XCom and deleted, as ``jobs status`` shows it."""
    assert _run("delivered", python_callable=add, op_args=[2, 3]) == 5
    job_id = _entry_of(config, "delivered")["job_id"]
    assert not config.store().exists(f"{job_id}/handle.json")

    status = as_json("jobs", "status", job_id)
    assert status["state"] == "SUCCEEDED"
    out = cli("jobs", "result", job_id, ok=False)
    assert out.returncode != 0
    assert "no kinetic job" not in out.stderr
    want = f"delivered to XCom of {DAG}/{RUN}/delivered (try 1) and deleted by cleanup on_success"
    assert want in out.stderr, out.stderr
    assert status["result"] == want


def test_an_entry_an_older_cancel_gave_a_batch_child_is_not_listed(config: KineticConfig):
    """A store from before: a cancel gave a batch child an entry of its own, with no
    task.  Its batch's entry names it as a child, so neither ``jobs list`` nor
    ``usage`` shows it as a job without a DAG."""
    store = config.store()
    identity = {"dag_id": DAG, "task_id": "old", "run_id": RUN, "map_index": -1}
    history.submitted(store, "grp-old", identity, backend="local", accelerator="cpu",
                      func="f", output_dir=None, kind="batch", total=1)  # fmt: skip
    history.update(store, "job-old", history.CANCELLED, "cancel requested")  # as it was
    history.update(store, "grp-old", "CANCELLED", "1 cancelled", child_jobs=["job-old"])
    assert history.read(store, "job-old") is not None
    assert [r["job_id"] for r in as_json("jobs", "list")] == ["grp-old"]
    usage = as_json("usage", "--by", "task")
    assert [(r["dag_id"], r["task_id"]) for r in usage["groups"]] == [(DAG, "old")]
