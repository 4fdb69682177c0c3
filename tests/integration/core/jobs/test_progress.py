"""Progress from inside a job's function, end to end on the local backend: a real
runner subprocess calls ``progress.update``, the worker's wait shows the lines (with an
ETA while it runs) and the task pushes the last update as XCom ``kinetic_progress``."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import progress as progress_core
from airflow_provider_kinetic.core.jobs.progress import read_progress
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.triggers.job import KineticJobTrigger
from tests.fixtures.fake_ti import FakeTI, StateStore
from tests.fixtures.waiting import wait_for


def train(release: str, steps: int) -> int:
    """Two steps reported, then held until the test has seen them, then the rest."""
    from airflow_provider_kinetic import progress

    progress.update(0, total=steps, metrics={"loss": 1.0})
    while time.time() == time.time():  # the second update at a later clock reading
        pass
    progress.update(1, total=steps, metrics={"loss": 0.5}, message="warming up")
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    for step in range(2, steps + 1):
        progress.update(step, total=steps, metrics={"loss": 1.0 / (step + 1)})
    return steps


def test_progress_lines_with_an_eta_show_while_it_runs_and_the_xcom_at_the_end(
    local_conn: Path, tmp_path: Path, capfd: Any, caplog: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KINETIC_PROGRESS_MIN_S", "0")  # every update written (not throttled)
    monkeypatch.setattr(progress_core, "READ_EVERY_S", 0.0)  # and read at every poll
    release = tmp_path / "release"
    op = KineticRunOperator(
        task_id="train",
        python_callable=train,
        op_args=[str(release), 100],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
        requirements=[],
        capture_env_vars=["KINETIC_PROGRESS_MIN_S"],
    )
    ctx = {"ti": FakeTI(task_id="train"), "task_state_store": StateStore()}
    out: dict[str, Any] = {}
    seen: list[str] = []

    def logged() -> str:  # the task log: Airflow's logging writes it to stdout
        seen.append("".join(capfd.readouterr()))
        return "".join(seen) + caplog.text

    def execute() -> None:
        try:
            out["value"] = op.execute(ctx)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            out["error"] = exc

    with caplog.at_level(logging.INFO):
        worker = threading.Thread(target=execute, name="task", daemon=True)
        worker.start()
        try:
            line = wait_for(
                "a progress line with an ETA",
                lambda: "step 1/100 (1%), ETA " in logged() or "error" in out,
                detail=logged,
            )
        finally:
            release.touch()
            worker.join(timeout=180)
    assert line is True and "error" not in out, out.get("error")
    assert out["value"] == 100
    text = logged()
    assert "loss 0.5, warming up" in text.split("step 1/100 (1%), ETA ", 1)[1].splitlines()[0]
    assert "step 100/100 (100%), loss 0.0099" in text  # the last, flushed at exit
    assert text.index("ETA ") < text.index("finished: SUCCEEDED")
    pushed = ctx["ti"].xcom["kinetic_progress"]
    assert (pushed["step"], pushed["total"], pushed["fraction"]) == (100, 100, 1.0)
    assert pushed["metrics"] == {"loss": 1.0 / 101} and pushed["first_step"] == 0
    job_id = JobHandle.from_dict(ctx["ti"].xcom["kinetic_job"]).job_id
    # pushed before the cleanup deleted the job's dir (the default policy on success)
    assert read_progress(LocalStore(str(local_conn)), job_id) is None


class Released(logging.Handler):
    """The trigger's task-log lines; touches ``release`` at the first with ``marker``."""

    def __init__(self, release: Path, marker: str = "ETA ") -> None:
        super().__init__()
        self.gate, self.marker, self.lines = release, marker, []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self.marker in self.lines[-1]:
            self.gate.touch()


def test_the_trigger_shows_progress_lines_with_an_eta_from_its_store_read(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KINETIC_PROGRESS_MIN_S", "0")
    monkeypatch.setattr(progress_core, "READ_EVERY_S", 0.0)
    release = tmp_path / "release"
    request = JobRequest(
        func=train, args=(str(release), 20), capture_env_vars=["KINETIC_PROGRESS_MIN_S"]
    )
    handle, _ = submit_job(request, config, backend)
    trigger = KineticJobTrigger(
        handle.to_dict(), config_to_json(config), poll_interval=0.05, not_before=0
    )
    handler = Released(release)
    trigger._log = logging.getLogger(f"kinetic.test.progress.{id(trigger)}")
    trigger._log.propagate = False
    trigger._log.addHandler(handler)

    async def follow() -> list:
        return [event async for event in trigger.run()]

    try:
        events = asyncio.run(follow())
    finally:
        trigger._log.removeHandler(handler)
    assert [e.payload["status"] for e in events] == ["SUCCEEDED"]
    prefix = f"kinetic job {handle.job_id}: "
    shown = [x[len(prefix) :] for x in handler.lines if x.startswith(prefix + "step ")]
    # the job holds at step 1 until a line with an ETA released it: that line is step 1's
    (held,) = [x for x in shown if x.startswith("step 1/20 (5%), ETA ")]
    assert held.endswith(", loss 0.5, warming up")
    assert all("ETA" not in x for x in shown if x.startswith("step 0/"))  # no rate yet
    assert shown[-1] == "step 20/20 (100%), loss 0.04762"  # the last, read at the end
    assert release.exists()  # released by a line with an ETA while the job ran


def sweep(i: int, release: str) -> int:
    """Reports half its steps, waits for the test's release, reports the rest."""
    from airflow_provider_kinetic import progress

    progress.update(1, total=2, metrics={"i": i})
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    progress.update(2, total=2)
    return i


def test_a_six_input_sweep_shows_its_aggregated_progress(
    local_conn: Path, tmp_path: Path, capfd: Any, caplog: Any, monkeypatch: Any
) -> None:
    """The batch's line: children done of total (an ETA once some ended) and the step
    each running child reported, written when it changes."""
    from airflow_provider_kinetic import KineticMapOperator
    from airflow_provider_kinetic.core.batch import progress as batch_progress

    monkeypatch.setattr(batch_progress, "READ_EVERY_S", 0.0)  # read at every poll
    release = tmp_path / "release"
    op = KineticMapOperator(
        task_id="sweep",
        python_callable=sweep,
        op_kwargs={"release": str(release)},
        inputs=list(range(6)),
        max_concurrent=3,
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
        requirements=[],
    )
    ctx = {"ti": FakeTI(task_id="sweep"), "task_state_store": StateStore()}
    out: dict[str, Any] = {}
    seen: list[str] = []

    def logged() -> str:
        seen.append("".join(capfd.readouterr()))
        return "".join(seen) + caplog.text

    def execute() -> None:
        try:
            out["value"] = op.execute(ctx)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            out["error"] = exc

    running = "0/6 children done (0%); child 0 step 1/2 (50%), child 1 step 1/2 (50%), "
    with caplog.at_level(logging.INFO):
        worker = threading.Thread(target=execute, name="sweep", daemon=True)
        worker.start()
        try:
            wait_for(
                "each running child's step in the batch's line",
                lambda: running + "child 2 step 1/2 (50%)" in logged() or "error" in out,
                detail=logged,
            )
        finally:
            release.touch()
            worker.join(timeout=180)
    assert "error" not in out, out.get("error")
    assert list(out["value"]) == list(range(6))
    text = logged()
    counts = [int(n) for n in re.findall(r"batch \S+: (\d)/6 children done \(\d+%\)", text)]
    assert counts == sorted(counts) and counts[-1] == 6, counts
    assert re.search(r"[1-5]/6 children done \(\d+%\), ETA ", text)  # from finished ones
    assert "6/6 children done (100%)" in text


def test_the_batch_trigger_shows_each_running_childs_step(
    config: KineticConfig, backend: LocalBackend, tmp_path: Path, monkeypatch: Any
) -> None:
    """A deferred batch's trigger writes the batch's line with its running children's
    reported steps (released by that line), then its event when a child ends."""
    from airflow_provider_kinetic.core.batch import progress as batch_progress
    from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
    from tests.fixtures import records

    monkeypatch.setattr(batch_progress, "READ_EVERY_S", 0.0)  # read at every poll
    release = tmp_path / "release"
    jobs = {
        i: submit_job(JobRequest(func=sweep, args=(i,), kwargs={"release": str(release)}),
                      config, backend)[0].job_id
        for i in range(2)
    }  # fmt: skip
    state = records.batch_state(2, jobs, root=config.bucket_name)
    trigger = KineticBatchTrigger(
        state=state.to_dict(), config=config_to_json(config), poll_interval=0.05, not_before=0
    )
    handler = Released(release, "child 0 step 1/2 (50%), child 1 step 1/2 (50%)")
    trigger._log = logging.getLogger(f"kinetic.test.progress.{id(trigger)}")
    trigger._log.propagate = False
    trigger._log.addHandler(handler)

    async def follow() -> list:
        return [event async for event in trigger.run()]

    try:
        events = asyncio.run(follow())
    finally:
        trigger._log.removeHandler(handler)
    assert [e.payload["status"] for e in events] == ["changed"]
    said = f"batch {state.group_id}: 0/2 children done (0%); child 0 step 1/2 (50%), "
    assert said + "child 1 step 1/2 (50%)" in handler.lines, handler.lines
    assert release.exists()
