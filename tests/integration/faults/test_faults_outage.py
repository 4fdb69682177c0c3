"""The local store goes away for 20 s under a deferred task: no work lost, none twice.

Real parts: Airflow ``dag.test()`` runs the task, which defers; ``dag.test()`` runs
the trigger inline in this process, so it is the real ``KineticJobTrigger`` poll loop
against the real local backend, while the job runs in its real supervisor and runner
processes.  The outage is the store's root renamed away (what an unmount looks like
to a path) and renamed back 20 s later.  The function returns during the outage, so
the runner too must wait for the store instead of writing its result into a fresh
empty root.  The backend's ``astatus`` is observed (wrapped, still called) only to
know when the trigger polls and what its polls met.

Before: the trigger's config check recreated the missing root empty, the poll said
NOT_FOUND at once, the task failed and the job's result went nowhere.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.jobs.taskrecord import RECORDS_PREFIX
from airflow_provider_kinetic.core.storage import StoreUnavailable
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.local_conn import cancel_jobs, set_local_conn
from tests.fixtures.waiting import wait_for

LOGICAL = pendulum.datetime(2026, 11, 23, tz="UTC")
OUTAGE_S = 20.0
WINDOW_S = 90.0  # [kinetic] store_outage_window_s for the test: longer than the outage


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # noqa: ANN201 - a generator
    root = set_local_conn(monkeypatch, tmp_path / "store", "kinetic_faults")
    monkeypatch.setenv("AIRFLOW__KINETIC__STORE_OUTAGE_WINDOW_S", str(WINDOW_S))
    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")  # defer at once
    yield root
    cancel_jobs(root)  # a failed test leaves no process


class Polls:
    """What the trigger's polls met: wraps ``LocalBackend.astatus`` and calls it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.first = threading.Event()
        self.errors: list[BaseException] = []
        self.count = 0
        original = LocalBackend.astatus

        async def astatus(backend: LocalBackend, handle):  # noqa: ANN001, ANN202
            self.count += 1
            self.first.set()
            try:
                return await original(backend, handle)
            except OSError as exc:
                self.errors.append(exc)
                raise

        monkeypatch.setattr(LocalBackend, "astatus", astatus)


def test_store_gone_for_20s_under_a_deferred_task(load_dag, root, tmp_path, monkeypatch):
    polls = Polls(monkeypatch)
    marker, release = tmp_path / "executions", tmp_path / "release"
    away = tmp_path / "store-unmounted"
    seen: dict[str, object] = {}
    ended = threading.Event()  # dag.test() returned: the outage thread gives up

    def outage() -> None:
        try:
            wait_for("the trigger to poll", lambda: polls.first.is_set() or ended.is_set(), 120)
            wait_for("the job to start", lambda: marker.exists() or ended.is_set())
            if ended.is_set():
                return
            os.rename(root, away)
            start = time.monotonic()
            release.touch()  # the function returns while its store is away
            wait_for(
                "the outage to last and the trigger to meet it",
                lambda: time.monotonic() - start >= OUTAGE_S and len(polls.errors) >= 3,
                timeout=OUTAGE_S + 30,
            )
            seen["root_recreated"] = root.exists()  # a poll must never make it again
            seen["lasted"] = time.monotonic() - start
        finally:
            if away.exists() and not root.exists():
                os.rename(away, root)
            release.touch()

    thread = threading.Thread(target=outage, name="store-outage")
    thread.start()
    began = time.monotonic()
    try:
        dag = load_dag("kinetic_fault_dags.py", "kinetic_fault_outage")
        conf = {"marker": str(marker), "release": str(release), "token": "t-outage"}
        dr = dag.test(logical_date=LOGICAL, run_conf=conf)
    finally:
        ended.set()
        thread.join(timeout=120)
    took = time.monotonic() - began
    assert seen.get("root_recreated") is False, seen
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", states
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert x[("held", "return_value")] == {"answer": 42, "token": "t-outage"}
    assert marker.read_text().count("ran") == 1  # the function ran once
    # The trigger polled through the outage: each poll a transient error, never NOT_FOUND.
    assert len(polls.errors) >= 3 and all(isinstance(e, StoreUnavailable) for e in polls.errors)
    assert any("still running" in str(e) for e in polls.errors), polls.errors[0]
    # One job, the one the task's record names; no other try, no superseded record.
    job_id = x[("held", "kinetic_job")]["job_id"]
    recs = sorted(p for p in (root / RECORDS_PREFIX).rglob("*.json"))
    assert len(recs) == 1 and job_id in recs[0].read_text()
    print(f"outage {seen['lasted']:.1f}s; dag.test {took:.1f}s; {polls.count} polls")
