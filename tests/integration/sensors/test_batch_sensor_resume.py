"""KineticBatchSensor resumes after its process died between launching a child and
saving the batch's live state: the next poke (a fresh sensor, as after a crash or in
reschedule mode) starts from the older ``live.json``, in which that child is still
queued, and launches it again under the same derived job id.  The local backend
refuses the duplicate (the job dir exists), ``create_job`` adopts the existing job,
and every input's function runs exactly once.

Real parts: the map operator submits on the local backend, children are real runner
subprocesses, the sensor's own ``poke`` drives the batch; only ``save_live`` is
patched, to fail once like a process dying at that point.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from airflow_provider_kinetic import KineticBatchSensor, KineticMapOperator
from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR, LocalBackend
from airflow_provider_kinetic.core.batch.launch import child_job_id
from airflow_provider_kinetic.core.batch.resume import load_live, save_live
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.local_conn import set_local_conn
from tests.fixtures.waiting import DEADLINE_S, wait_for

CONN = "kinetic_batch_resume"
INPUTS = [2, 3, 4]


def record_square(x: int, marker_dir: str) -> int:
    """One line per execution in ``marker_dir/x``; the value is x squared."""
    import os

    with open(os.path.join(marker_dir, str(x)), "a") as f:
        f.write(f"ran in {os.getpid()}\n")
    return x * x


class Crash(RuntimeError):
    """The sensor's process 'dies' here."""


@pytest.fixture
def root(monkeypatch, tmp_path) -> Path:
    return set_local_conn(monkeypatch, tmp_path / "kinetic", CONN)


def _sensor(batch: dict) -> KineticBatchSensor:
    """A new sensor object: no in-memory state, as in a new process."""
    return KineticBatchSensor(
        task_id="wait",
        batch=batch,
        kinetic_conn_id=CONN,
        return_result=True,
        mode="reschedule",
        poke_interval=0.1,
    )


def _wait_for_a_child_to_end(backend: LocalBackend, sensor: KineticBatchSensor) -> None:
    """Block (bounded) until one of the sensor's active children wrote its exit code."""
    state = sensor._state
    if state is not None and state.active:
        backend.wait(list(state.active.values()), 2.0)


def _group_gone(pgid: int) -> bool:
    """Whether the job's process group (its supervisor and runner; the supervisor
    leads it) is gone: it may still be exiting just after its exit code was written."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_sensor_crash_before_save_live_adopts_the_relaunched_child(
    root, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO)
    markers = tmp_path / "markers"
    markers.mkdir()
    submit = KineticMapOperator(
        task_id="submit",
        python_callable=record_square,
        inputs=INPUTS,
        op_kwargs={"marker_dir": str(markers)},
        max_concurrent=1,  # the sensor launches inputs[1] and inputs[2]
        wait_for_completion=False,
        kinetic_conn_id=CONN,
    )
    batch = submit.execute({"ti": FakeTI()})
    group = batch["group_id"]
    store, backend, secret = LocalStore(str(root)), LocalBackend(str(root)), deployment_secret()
    jobs = [child_job_id(group, i, 1) for i in range(len(INPUTS))]
    saved = load_live(store, group, secret)
    assert sorted(saved.active) == [0] and saved.queue == [1, 2]

    # ---- poke until the poke that launched inputs[1]; its save_live "crashes" ----------
    crashed: list[dict] = []

    def crash_once(store_, state, secret_):
        if not crashed and 1 in state.jobs:
            crashed.append({"jobs": dict(state.jobs), "launches": dict(state.launches)})
            raise Crash("sensor process died before saving the live state")
        save_live(store_, state, secret_)

    monkeypatch.setattr("airflow_provider_kinetic.sensors.batch.save_live", crash_once)
    first = _sensor(batch)
    deadline = time.monotonic() + DEADLINE_S
    with pytest.raises(Crash):
        while time.monotonic() < deadline:
            assert first.poke({}) is False
            _wait_for_a_child_to_end(backend, first)
    assert crashed == [{"jobs": {0: jobs[0], 1: jobs[1]}, "launches": {0: 1, 1: 1}}]
    # inputs[1] really was launched, but the saved state does not know it.
    assert (root / STATE_DIR / jobs[1]).is_dir()
    stale = load_live(store, group, secret)
    assert stale.queue == [1, 2] and 1 not in stale.jobs and 1 not in stale.launches
    assert "exists; keeping it" not in caplog.text

    # ---- fresh sensors (each loads live.json) drive the batch to the end -------------
    caplog.clear()
    result = None
    deadline = time.monotonic() + DEADLINE_S
    pids: dict[str, int] = {}  # each child's supervisor, seen before it is released
    while result is None:
        assert time.monotonic() < deadline, load_live(store, group, secret).to_dict()
        for job in jobs:
            if (pid_file := root / STATE_DIR / job / "pid").exists():
                pids[job] = int(pid_file.read_text())
        sensor = _sensor(batch)
        done = sensor.poke({})
        if done:
            result = done
        else:
            _wait_for_a_child_to_end(backend, sensor)

    assert result.is_done and result.xcom_value == [x * x for x in INPUTS]
    # Each function ran exactly once: one line in its marker file.
    for x in INPUTS:
        lines = (markers / str(x)).read_text().splitlines()
        assert len(lines) == 1, (x, lines)

    # The relaunch of inputs[1] hit the existing job and adopted it.
    adopted = [
        r
        for r in caplog.records
        if r.name == "airflow_provider_kinetic.core.jobs.submit"
        and "exists; keeping it" in r.message
    ]
    assert [r.levelno for r in adopted] == [logging.WARNING]
    assert jobs[1] in adopted[0].message
    assert "could not submit" not in caplog.text and "removing its artifacts" not in caplog.text
    final = load_live(store, group, secret)
    assert final.jobs == dict(enumerate(jobs)) and final.launches == {0: 1, 1: 1, 2: 1}
    assert final.done == {0: "SUCCEEDED", 1: "SUCCEEDED", 2: "SUCCEEDED"} and not final.active
    # No other job was ever created (the batch's history names every job it made), none
    # is still running, and their local state went once the batch was delivered.
    assert history.read(store, group)["child_jobs"] == jobs
    assert list((root / STATE_DIR).iterdir()) == []
    assert sorted(pids) == sorted(jobs)
    for job, pid in pids.items():
        wait_for(f"{job} (process group {pid}) to be gone", lambda pid=pid: _group_gone(pid))
