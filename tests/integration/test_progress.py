"""Progress from inside a job's function, end to end on the local backend: a real
runner subprocess calls ``progress.update``, the worker's wait shows the lines (with an
ETA while it runs) and the task pushes the last update as XCom ``kinetic_progress``."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.jobs.progress import read_progress
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
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
