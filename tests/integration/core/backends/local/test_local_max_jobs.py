"""``[kinetic] local_max_jobs`` on the local backend: real submits from two processes,
real supervisors, real ``flock``s in a per-test slots dir (``KINETIC_LOCAL_SLOTS``).

Each job is a shell command that records its pid and start time, waits for its own
``go`` file, and records its end time: the test decides when each job may end and
reads from the jobs' own records how many ran at once and in which order they
started.  Nothing is synchronised by sleeping: conditions are polled with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local import slot_queue
from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR, LocalBackend
from airflow_provider_kinetic.core.backends.local.gpus import GPUS_ENV, LOCKS_ENV
from airflow_provider_kinetic.core.backends.local.slots import SLOTS_ENV, LocalMaxJobsError
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.spec.pod import JobSpec, SpecInputs, build_job_spec
from tests.fixtures import records, waiting
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.local_conn import set_local_conn
from tests.fixtures.local_jobs import most_at_once
from tests.fixtures.waiting import DEADLINE_S, wait_for

REPO = Path(__file__).resolve().parents[5]


def gated_spec(root: str, job_id: str, marks: str, accelerator: str = "cpu") -> JobSpec:
    """A job that records ``{pid} {start ns}``, waits for ``{job_id}.go``, records its end."""
    at = f"{marks}/{job_id}"
    script = (
        f'echo "$$ $(date +%s%N)" > {at}.start.tmp && mv {at}.start.tmp {at}.start; '
        f"while [ ! -e {at}.go ]; do sleep 0.01; done; "
        f"date +%s%N > {at}.end.tmp && mv {at}.end.tmp {at}.end"
    )
    spec = build_job_spec(
        SpecInputs(
            job_id=job_id,
            bucket=root,
            context_uri="c",
            payload_uri="p",
            result_uri="r",
            payload_sha256="0",
            context_sha256="0",
            accelerator=parse_accelerator(accelerator),
            image="i",
            output_dir=root,
            runner_command=["/bin/sh", "-c", script],
        )
    )
    spec.container["args"] = []
    return spec


class Jobs:
    """Gated jobs under one root and marks dir, submitted through ``backend``."""

    def __init__(self, root: str, marks: Path, backend: LocalBackend) -> None:
        self.root, self.marks, self.backend = root, marks, backend

    def submit(self, job_id: str, accelerator: str = "cpu") -> JobHandle:
        self.backend.submit(gated_spec(self.root, job_id, str(self.marks), accelerator))
        return self.handle(job_id)

    def handle(self, job_id: str) -> JobHandle:
        return records.handle(job_id, self.root)

    def started(self, job_id: str) -> bool:
        return (self.marks / f"{job_id}.start").exists()

    def release(self, job_id: str) -> None:
        (self.marks / f"{job_id}.go").touch()

    def times(self, job_id: str) -> tuple[int, int]:
        start = int((self.marks / f"{job_id}.start").read_text().split()[1])
        return start, int((self.marks / f"{job_id}.end").read_text())

    def child_pid(self, job_id: str) -> int:
        return int((self.marks / f"{job_id}.start").read_text().split()[0])

    def message(self, job_id: str) -> str | None:
        """The queued line up to its place and holders (``why``: those)."""
        why = self.why(job_id)
        return why and why.split(";")[0]

    def why(self, job_id: str) -> str | None:
        report = self.backend.status(self.handle(job_id))
        return report.message if report.status is JobStatus.PENDING else None

    def ended(self, job_id: str, status: JobStatus) -> Any:
        handle = self.handle(job_id)
        report = wait_for(f"{job_id} to end", lambda: waiting.ended(self.backend.status(handle)))
        assert report.status is status, (report, self.backend.read_logs(handle))
        return report


@pytest.fixture
def slots(tmp_path: Path, monkeypatch) -> Path:
    """This test's own machine-wide slots (no other test's jobs take them)."""
    monkeypatch.setenv(SLOTS_ENV, str(tmp_path / "slots"))
    return tmp_path / "slots"


@pytest.fixture
def jobs(config: KineticConfig, slots: Path, tmp_path: Path) -> Iterator[Callable[[int], Jobs]]:
    marks = tmp_path / "marks"
    marks.mkdir()
    made: list[Jobs] = []

    def make(limit: int) -> Jobs:
        made.append(Jobs(config.bucket_name, marks, LocalBackend(config.bucket_name, limit)))
        return made[-1]

    yield make
    state = Path(config.bucket_name, STATE_DIR)
    for jdir in state.iterdir() if state.is_dir() else []:  # nothing outlives the test
        LocalBackend(config.bucket_name).cancel(records.handle(jdir.name, config.bucket_name))


SUBMITTER = """
import sys
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from tests.integration.core.backends.local.test_local_max_jobs import gated_spec

root, marks, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
backend = LocalBackend(root, max_jobs=limit)
print("ready", flush=True)
for line in sys.stdin:
    backend.submit(gated_spec(root, line.strip(), marks))
    print("submitted", flush=True)
"""


@pytest.fixture
def other_process(config: KineticConfig, tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """Submits a job from a second process (another worker, as far as the limit knows)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SUBMITTER, config.bucket_name, str(tmp_path / "marks"), "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "ready"

    def submit(job_id: str) -> None:
        proc.stdin.write(job_id + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "submitted"

    yield submit
    proc.stdin.close()
    proc.wait(DEADLINE_S)


def test_two_processes_share_the_limit_in_submit_order(jobs, other_process) -> None:
    here = jobs(2)
    ids = [f"job-fifo-{i}" for i in range(5)]
    for i, job_id in enumerate(ids):  # alternately from this process and the other
        here.submit(job_id) if i % 2 == 0 else other_process(job_id)
    wait_for("the first two to start", lambda: here.started(ids[0]) and here.started(ids[1]))
    expected = {
        ids[2]: "queued: 0 jobs ahead (local_max_jobs=2)",
        ids[3]: "queued: 1 job ahead (local_max_jobs=2)",
        ids[4]: "queued: 2 jobs ahead (local_max_jobs=2)",
    }
    wait_for("three jobs queued", lambda: {j: here.message(j) for j in expected} == expected)
    assert not any(here.started(j) for j in expected)
    log = lambda: here.backend.read_logs(here.handle(ids[4]))[0]  # noqa: E731
    wait_for("the job's log to say it is queued", lambda: "kinetic: queued: " in log())
    # Each job that ends lets in the first job still queued, and no other.
    for i, job_id in enumerate(ids):
        here.release(job_id)
        if i + 2 < len(ids):
            wait_for(f"{ids[i + 2]} to start", lambda i=i: here.started(ids[i + 2]))
            assert not any(here.started(j) for j in ids[i + 3 :])
            if i + 3 < len(ids):
                assert here.message(ids[i + 3]) == "queued: 0 jobs ahead (local_max_jobs=2)"
    for job_id in ids:
        here.ended(job_id, JobStatus.SUCCEEDED)
    # From the jobs' own records: never more than two at once, queued ones in order.
    times = [here.times(j) for j in ids]
    assert most_at_once(times) == 2
    assert times[2][0] < times[3][0] < times[4][0]
    assert "job slot free after" in here.backend.read_logs(here.handle(ids[4]))[0]


def test_a_queued_job_says_its_position_and_which_job_holds_its_slot(jobs) -> None:
    here = jobs(1)
    first, second, third = (here.submit(f"job-why-{i}") for i in range(3))
    wait_for("the first job to start", lambda: here.started(first.job_id))
    want = {
        second.job_id: "queued: 0 jobs ahead (local_max_jobs=1); position 1 of 2; "
        "slot held by job-why-0",
        third.job_id: "queued: 1 job ahead (local_max_jobs=1); position 2 of 2; "
        "slot held by job-why-0",
    }
    wait_for("both queued", lambda: {j: here.why(j) for j in want} == want, detail=lambda: {
        j: here.why(j) for j in want})  # fmt: skip
    here.release(first.job_id)
    wait_for("the second job to start", lambda: here.started(second.job_id))
    here.ended(first.job_id, JobStatus.SUCCEEDED)
    assert here.why(third.job_id) == (
        "queued: 0 jobs ahead (local_max_jobs=1); position 1 of 1; slot held by job-why-1"
    )
    for job in (second, third):
        here.release(job.job_id)
        here.ended(job.job_id, JobStatus.SUCCEEDED)


def test_a_sigkilled_job_frees_its_slot(jobs) -> None:
    here = jobs(1)
    first, second, third = (here.submit(f"job-kill-{i}") for i in range(3))
    wait_for("the first job to start", lambda: here.started(first.job_id))
    wait_for("the second job queued", lambda: here.message(second.job_id))
    pgid = int(Path(here.backend.job_dir(first.job_id), "pid").read_text())
    os.killpg(pgid, signal.SIGKILL)  # supervisor and job: no clean-up code runs at all
    wait_for("the second job to start", lambda: here.started(second.job_id))
    assert "killed" in here.ended(first.job_id, JobStatus.FAILED).reason
    os.kill(here.child_pid(second.job_id), signal.SIGKILL)  # the job alone
    wait_for("the third job to start", lambda: here.started(third.job_id))
    here.ended(second.job_id, JobStatus.FAILED)
    here.release(third.job_id)
    here.ended(third.job_id, JobStatus.SUCCEEDED)


def test_a_cancelled_queued_job_leaves_the_queue(jobs, slots: Path) -> None:
    here = jobs(1)
    first, second, third = (here.submit(f"job-cancel-{i}") for i in range(3))
    wait_for("the first job to start", lambda: here.started(first.job_id))
    wait_for("the third job queued", lambda: here.message(third.job_id))
    assert here.message(third.job_id) == "queued: 1 job ahead (local_max_jobs=1)"
    here.backend.cancel(second)
    assert here.ended(second.job_id, JobStatus.FAILED).reason == "cancelled"
    assert len(slot_queue.waiting(str(slots))) == 1  # only the third's ticket is left
    assert here.message(third.job_id) == "queued: 0 jobs ahead (local_max_jobs=1)"
    here.release(first.job_id)
    wait_for("the third job to start", lambda: here.started(third.job_id))
    assert not here.started(second.job_id)
    here.release(third.job_id)
    here.ended(third.job_id, JobStatus.SUCCEEDED)
    assert slot_queue.waiting(str(slots)) == []


def test_a_dead_queued_supervisor_never_blocks_the_queue(jobs, slots: Path) -> None:
    here = jobs(1)
    first, second, third = (here.submit(f"job-dead-{i}") for i in range(3))
    wait_for("the first job to start", lambda: here.started(first.job_id))
    wait_for("the third job queued", lambda: here.message(third.job_id))
    pgid = int(Path(here.backend.job_dir(second.job_id), "pid").read_text())
    os.killpg(pgid, signal.SIGKILL)  # no handler runs: its ticket stays, unlocked
    here.ended(second.job_id, JobStatus.FAILED)
    here.release(first.job_id)
    wait_for("the third job to start", lambda: here.started(third.job_id))
    assert slot_queue.waiting(str(slots)) == []  # the dead ticket was cleared
    here.release(third.job_id)
    here.ended(third.job_id, JobStatus.SUCCEEDED)


def test_batch_status_lists_the_queue_once(jobs, monkeypatch) -> None:
    here = jobs(1)
    handles = [here.submit(f"job-batch-{i}") for i in range(4)]
    wait_for("the first job to start", lambda: here.started(handles[0].job_id))
    wait_for("the last job queued", lambda: here.message(handles[3].job_id))
    listed: list[str] = []
    real = slot_queue.waiting
    monkeypatch.setattr(slot_queue, "waiting", lambda d: listed.append(d) or real(d))
    reports = here.backend.batch_status("group", handles)
    assert len(listed) == 1
    assert [reports[h.job_id].describe() for h in handles] == [
        "RUNNING",
        "PENDING: queued: 0 jobs ahead (local_max_jobs=1); position 1 of 3; slot held by "
        "job-batch-0",
        "PENDING: queued: 1 job ahead (local_max_jobs=1); position 2 of 3; slot held by "
        "job-batch-0",
        "PENDING: queued: 2 jobs ahead (local_max_jobs=1); position 3 of 3; slot held by "
        "job-batch-0",
    ]


def test_gpu_jobs_take_no_slot(jobs, monkeypatch, tmp_path) -> None:
    """Their devices bound them: a GPU job starts while every CPU slot is taken, and
    takes none from the CPU jobs queued behind it."""
    monkeypatch.setenv(GPUS_ENV, "NVIDIA L4")
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "gpu-locks"))
    here = jobs(1)
    cpu = here.submit("job-gpu-cpu-0")
    wait_for("the CPU job to start", lambda: here.started(cpu.job_id))
    gpu = here.submit("job-gpu-l4", accelerator="gpu-l4x1")
    queued = here.submit("job-gpu-cpu-1")
    wait_for("the GPU job to start", lambda: here.started(gpu.job_id))
    assert not Path(here.backend.job_dir(gpu.job_id), slot_queue.SLOTS_FILE).exists()
    assert here.message(queued.job_id) == "queued: 0 jobs ahead (local_max_jobs=1)"
    here.release(cpu.job_id)
    wait_for("the queued CPU job to start", lambda: here.started(queued.job_id))
    for handle in (gpu, queued):
        here.release(handle.job_id)
        here.ended(handle.job_id, JobStatus.SUCCEEDED)


def test_a_bad_limit_fails_the_submit_before_any_job_state(jobs) -> None:
    here = jobs(0)
    with pytest.raises(LocalMaxJobsError, match="at least 1"):
        here.submit("job-bad-limit")
    assert not Path(here.backend.job_dir("job-bad-limit")).exists()


def until_released(release: str) -> str:
    import os

    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    return "done"


def test_the_queued_message_reaches_the_task_log(
    jobs, monkeypatch, caplog, capfd, config, tmp_path
) -> None:
    """A sync KineticRunOperator logs each status change (``report.describe()``): a job
    over ``[kinetic] local_max_jobs`` shows as queued in the task log, then runs."""
    from airflow_provider_kinetic import KineticRunOperator

    blocker = jobs(1)
    set_local_conn(monkeypatch, config.root, "kinetic_limited")
    monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_MAX_JOBS", "1")
    held = blocker.submit("job-log-blocker")
    wait_for("the blocker to start", lambda: blocker.started(held.job_id))
    op = KineticRunOperator(
        task_id="t",
        python_callable=until_released,
        op_args=[str(tmp_path / "release")],  # running until its RUNNING line is seen
        kinetic_conn_id="kinetic_limited",
        deferrable=False,
        poll_interval=0.1,
    )
    out: list[Any] = []

    worker = threading.Thread(target=lambda: out.append(op.execute({"ti": FakeTI()})))
    seen: list[str] = []

    def task_log() -> str:  # the task logger writes to stdout (structlog) or to logging
        seen.append(capfd.readouterr().out)
        return "".join(seen) + caplog.text

    queued = "PENDING: queued: 0 jobs ahead (local_max_jobs=1)"
    with caplog.at_level("INFO"):
        worker.start()
        wait_for("the task log to show the job queued", lambda: queued in task_log())
        # ... and the job's own log line (its supervisor's), streamed into the task log
        wait_for("the job's line", lambda: "] kinetic: queued: 0 jobs ahead" in task_log())
        blocker.release(held.job_id)
        wait_for("the task log to show the job running", lambda: "RUNNING" in task_log())
        (tmp_path / "release").touch()
        worker.join(DEADLINE_S)
    assert out == ["done"]
    text = task_log()
    assert text.index(queued) < text.index("RUNNING") < text.index("finished: SUCCEEDED")
