"""The local backend: a detached process per job, with all state on disk, so that any
process (a trigger, a retried task) can read status, logs and the result."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local import presence as local_presence
from airflow_provider_kinetic.core.backends.local.backend import (
    _START_GRACE_S,
    STATE_DIR,
    LocalBackend,
    local_command,
    local_devices,
    local_env,
)
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
from tests.fixtures import records
from tests.fixtures.waiting import ended, wait_for

REPO_ROOT = Path(__file__).resolve().parents[5]


def wait_terminal(backend: LocalBackend, handle: dict, expect: JobStatus | None = None):
    report = wait_for(
        f"job {handle.job_id} to finish",
        lambda: ended(backend.status(handle)),
        detail=lambda: backend.read_logs(handle)[0],
    )
    if expect is not None:
        assert report.status is expect, f"{report.describe()}; log:\n{backend.read_logs(handle)[0]}"
    return report


def pid_alive(pid: int) -> bool:
    """A zombie (exited, not yet reaped) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def submit(config: KineticConfig, backend: LocalBackend, func, *args, **kwargs):
    return submit_job(JobRequest(func=func, args=args, kwargs=kwargs), config, backend)


# ---- job functions --------------------------------------------------------------------


def wait_for_file(path: str, value: Any = "done") -> Any:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    return value


def fail(msg: str) -> None:
    raise RuntimeError(msg)


def chatty(ready: str, go: str) -> str:
    print("line1")
    print("line2")
    sys.stdout.write("partial")
    sys.stdout.flush()
    Path(ready).touch()
    wait_for_file(go)
    print("-end")
    print("line3")
    return "ok"


def spawn_and_hang(pid_file: str) -> None:
    child = subprocess.Popen(["sleep", "300"])
    Path(pid_file + ".tmp").write_text(f"{os.getpid()} {child.pid}")
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(300)  # timing-ok: the job's workload hangs until the test cancels it


def report_process(keys: list[str]) -> dict:
    return {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}


# ---- tests ------------------------------------------------------------------------------


def test_job_outlives_the_submitting_process(config, backend, tmp_path: Path) -> None:
    release = tmp_path / "release"
    script = textwrap.dedent(
        f"""
        import json, os, time
        from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
        from airflow_provider_kinetic.core.config import KineticConfig
        from airflow_provider_kinetic.core.jobs.request import JobRequest
        from airflow_provider_kinetic.core.jobs.submit import submit_job

        def job(path):
            deadline = time.monotonic() + 60
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.02)
            print("job saw the release file", flush=True)
            return "survived"

        cfg = KineticConfig(backend="local", root={config.root!r})
        handle, _ = submit_job(
            JobRequest(func=job, args=({str(release)!r},)), cfg, LocalBackend(cfg.bucket_name)
        )
        print(handle.to_json().decode())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert out.returncode == 0, out.stderr
    handle = JobHandle.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))
    reader = LocalBackend(config.bucket_name)  # a fresh object; the submitter is gone
    assert reader.status(handle).status is JobStatus.RUNNING
    release.touch()
    report = wait_terminal(reader, handle, JobStatus.SUCCEEDED)
    logs, offset = reader.read_logs(handle)
    assert "job saw the release file" in logs and offset == len(logs.encode())
    assert collect(config.store(), handle.job_id, report.status) == "survived"


def test_a_job_whose_submitter_died_before_starting_it_fails_not_starts_forever(
    config, backend
) -> None:
    """The submitting process is SIGKILLed after making the job dir, before starting
    its supervisor (a triggerer killed mid-launch).  The job reads "starting" for the
    grace a submit needs, then FAILED, never started: not PENDING for ever."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from airflow_provider_kinetic.core.backends.local import backend as local
        from airflow_provider_kinetic.core.config import KineticConfig
        from airflow_provider_kinetic.core.jobs.request import JobRequest
        from airflow_provider_kinetic.core.jobs.submit import submit_job

        take = local.local_slots.take_ticket

        def take_then_die(*args, **kwargs):
            take(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        local.local_slots.take_ticket = take_then_die
        cfg = KineticConfig(backend="local", root={config.root!r})
        backend = local.LocalBackend(cfg.bucket_name)
        submit_job(JobRequest(func=print, args=("never",)), cfg, backend)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert out.returncode == -signal.SIGKILL, out.stderr
    (job_id,) = os.listdir(os.path.join(config.bucket_name, STATE_DIR))
    handle = records.handle(job_id, config.bucket_name)
    assert backend.status(handle) == StatusReport(JobStatus.PENDING, "starting")
    jdir = backend.job_dir(job_id)
    then = time.time() - _START_GRACE_S - 1  # the grace has passed
    os.utime(jdir, (then, then))
    report = backend.status(handle)
    assert report.status is JobStatus.FAILED and "never started" in (report.reason or "")
    backend.release(handle)
    assert not os.path.exists(jdir)


def test_status_lifecycle(config, backend, tmp_path: Path) -> None:
    assert backend.status(records.handle("job-nothere")).status is JobStatus.NOT_FOUND
    # The state a reader sees between the job dir being made and the process starting.
    os.makedirs(backend.job_dir("job-starting"))
    pending = backend.status(records.handle("job-starting"))
    assert pending.status is JobStatus.PENDING and pending.reason == "starting"

    go = tmp_path / "go"
    handle, _ = submit(config, backend, wait_for_file, str(go), 42)
    assert backend.status(handle).status is JobStatus.RUNNING
    go.touch()
    report = wait_terminal(backend, handle, JobStatus.SUCCEEDED)
    assert report == StatusReport(JobStatus.SUCCEEDED)
    assert collect(config.store(), handle.job_id, report.status) == 42

    handle, _ = submit(config, backend, fail, "boom")
    report = wait_terminal(backend, handle)
    assert report.status is JobStatus.FAILED and report.reason == "exit code 1"
    with pytest.raises(RuntimeError, match="boom"):
        collect(config.store(), handle.job_id, report.status)


def test_a_supervisor_caught_in_exec_is_running_not_killed(
    config, backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen once in the full suite: a status read 8 ms after submit said "killed".
    ``Popen`` returns while the kernel is still setting up the new program, when
    ``/proc/PID/cmdline`` reads empty.  A live supervisor read so is RUNNING; past
    the grace an exec needs, an empty command line is a reused pid, not the job."""
    handle, _ = submit(config, backend, wait_for_file, str(tmp_path / "never"))
    jdir = backend.job_dir(handle.job_id)
    assert backend.status(handle).status is JobStatus.RUNNING
    monkeypatch.setattr(local_presence, "_cmdline", lambda pid: b"")  # the moment in exec
    assert backend.status(handle).status is JobStatus.RUNNING
    then = time.time() - local_presence.EXEC_GRACE_S - 1
    os.utime(os.path.join(jdir, "pid"), (then, then))
    report = backend.status(handle)
    assert report.status is JobStatus.FAILED and "killed" in (report.reason or "")
    monkeypatch.undo()  # the real command line again: the job it is
    assert backend.status(handle).status is JobStatus.RUNNING


def test_killed_supervisor_is_failed(config, backend, tmp_path: Path) -> None:
    handle, _ = submit(config, backend, wait_for_file, str(tmp_path / "never"))
    pid = int(Path(backend.job_dir(handle.job_id), "pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    report = wait_terminal(backend, handle)
    assert report.status is JobStatus.FAILED
    assert "killed" in (report.reason or "")


def test_cancel_of_a_dead_job_never_signals_a_reused_pid(config, backend, tmp_path) -> None:
    handle, _ = submit(config, backend, wait_for_file, str(tmp_path / "never"))
    jdir = backend.job_dir(handle.job_id)
    os.killpg(int(Path(jdir, "pid").read_text()), signal.SIGKILL)
    wait_terminal(backend, handle, JobStatus.FAILED)
    # The dead supervisor's pid now belongs to an unrelated process group leader.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # Its exec done: a command line read empty mid-exec is a supervisor starting up
        # (``local/presence.py``), which cancel would rightly signal.
        cmdline = Path(f"/proc/{stranger.pid}/cmdline")
        wait_for("the stranger's exec", lambda: cmdline.read_bytes() == b"sleep\x00300\x00")
        Path(jdir, "pid").write_text(str(stranger.pid))
        backend.cancel(handle)
        assert stranger.poll() is None and pid_alive(stranger.pid)
        assert backend.status(handle).status is JobStatus.FAILED
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


def test_read_logs_returns_only_new_whole_lines(config, backend, tmp_path: Path) -> None:
    ready, go = tmp_path / "ready", tmp_path / "go"
    handle, _ = submit(config, backend, chatty, str(ready), str(go))
    wait_for("the job to print its partial line", ready.exists)
    first, offset = backend.read_logs(handle)
    assert first.endswith("line2\n") and "line1\n" in first
    assert "partial" not in first
    assert offset == len(first.encode())
    again, same = backend.read_logs(handle, offset)
    assert (again, same) == ("", offset)  # the partial line is held back
    go.touch()
    wait_terminal(backend, handle, JobStatus.SUCCEEDED)
    rest, end = backend.read_logs(handle, offset)
    assert rest.startswith("partial-end\nline3\n")
    assert "line1" not in rest and end == offset + len(rest.encode())
    assert backend.read_logs(records.handle("job-nothere"), 7) == ("", 7)


def long_lines() -> None:
    """Short lines, a line of 10,000 three-byte characters, short lines again."""
    import sys

    sys.stdout.write("".join(f"short {i}\n" for i in range(50)))
    sys.stdout.write("\u20ac" * 10_000 + "\n")
    sys.stdout.write("".join(f"after {i}\n" for i in range(50)))


def test_capped_reads_are_bounded_and_add_up_to_the_log(config, backend) -> None:
    """Each capped read reads at most ``max_bytes`` of the file: whole lines, or a
    piece of a line that alone is longer (cut between characters); the reads, one
    after another, give the whole log once."""
    handle, _ = submit(config, backend, long_lines)
    wait_terminal(backend, handle, JobStatus.SUCCEEDED)
    whole, end = backend.read_logs(handle)
    cap, offset, pieces = 1000, 0, []
    while True:
        text, moved = backend.read_logs(handle, offset, max_bytes=cap)
        if moved == offset:
            break
        assert 0 < len(text.encode()) == moved - offset <= cap
        assert "\ufffd" not in text  # never cut inside a character
        assert text.endswith("\n") or set(text) == {"\u20ac"}  # whole lines, or a piece
        pieces.append(text)
        offset = moved
    assert "".join(pieces) == whole and offset == end
    assert len([t for t in pieces if "\u20ac" in t]) >= 30_000 // cap  # the long line: pieces


def test_cancel_kills_the_process_group(config, backend, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    handle, _ = submit(config, backend, spawn_and_hang, str(pid_file))
    wait_for("the job to start its child", pid_file.exists)
    runner_pid, child_pid = (int(p) for p in pid_file.read_text().split())
    try:
        assert pid_alive(runner_pid) and pid_alive(child_pid)
        assert backend.status(handle).status is JobStatus.RUNNING
        LocalBackend(config.bucket_name).cancel(handle)  # any instance can cancel
        gone = lambda: not pid_alive(runner_pid) and not pid_alive(child_pid)  # noqa: E731
        wait_for("the job's process group to die", gone)
    finally:
        for pid in (child_pid, runner_pid):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    report = wait_terminal(backend, handle)
    assert report.status is JobStatus.FAILED and report.reason == "cancelled"
    backend.cancel(handle)  # cancelling a finished job is a no-op
    assert backend.status(handle).reason == "cancelled"


def test_second_submit_of_the_same_job_id_raises(config, backend, tmp_path: Path) -> None:
    go = tmp_path / "go"
    handle, spec = submit(config, backend, wait_for_file, str(go), "first")
    with pytest.raises(FileExistsError):
        backend.submit(spec)
    go.touch()
    report = wait_terminal(backend, handle, JobStatus.SUCCEEDED)
    assert collect(config.store(), handle.job_id, report.status) == "first"


class BrokenBackend(LocalBackend):
    """Creation fails; ``created`` says whether the job exists anyway (e.g. a 409)."""

    def __init__(self, root: str, created: bool = False):
        super().__init__(root)
        self.created = created

    def submit(self, spec) -> None:
        if self.created:
            os.makedirs(self.job_dir(spec.job_id))
            Path(self.job_dir(spec.job_id), "exit_code").write_text("0")
        raise RuntimeError("create failed")


def test_failed_create_removes_job_artifacts(config, tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / "x").write_text("x")
    from airflow_provider_kinetic.core.data import Data

    store = config.store()
    request = JobRequest(func=fail, args=(Data(str(data)),), job_id="job-broken1")
    with pytest.raises(RuntimeError, match="create failed"):
        submit_job(request, config, BrokenBackend(config.bucket_name), store)
    assert store.list("job-broken1") == []
    assert not os.path.exists(os.path.join(config.bucket_name, STATE_DIR, "job-broken1"))
    # The shared data cache is content, not job state: it stays for the next submit.
    assert store.list("default/data-markers/")
    # If the job exists despite the error, its artifacts are kept.
    request.job_id = "job-broken2"
    handle, _ = submit_job(request, config, BrokenBackend(config.bucket_name, True), store)
    assert handle.job_id == "job-broken2"
    names = {k.rsplit("/", 1)[1] for k in store.list("job-broken2/")}
    assert names == {"payload.pkl", "handle.json"}  # the context is shared, in its cache


def test_process_argv_and_env_come_from_the_spec(config, backend) -> None:
    keys = ["JOB_ID", "GCS_BUCKET", "KERAS_BACKEND", "JAX_PLATFORMS", "KINETIC_OUTPUT_DIR"]
    handle, spec = submit(config, backend, report_process, keys)
    recorded = json.loads(Path(backend.job_dir(handle.job_id), "spec.json").read_text())
    assert recorded["argv"] == local_command(spec)
    assert recorded["argv"][-len(spec.args) :] == spec.args
    assert recorded["env"] == local_env(spec)[0]
    assert recorded["name"] == spec.name
    report = wait_terminal(backend, handle, JobStatus.SUCCEEDED)
    seen = collect(config.store(), handle.job_id, report.status)
    assert seen["argv"] == spec.args
    assert seen["env"] == {k: spec.env[k] for k in keys}
    assert seen["env"]["JOB_ID"] == handle.job_id


def _spec(accelerator: str):
    return build_job_spec(
        SpecInputs(
            job_id="job-accel",
            bucket="/b",
            context_uri="file:///b/c",
            payload_uri="file:///b/p",
            result_uri="file:///b/r",
            payload_sha256="0" * 64,
            context_sha256="1" * 64,
            accelerator=parse_accelerator(accelerator),
            image="img",
            output_dir="/b/out",
        )
    )


@pytest.mark.parametrize("accelerator, word", [("gpu-l4x4", "GPU"), ("tpu-v5e-4", "TPU")])
def test_accelerator_on_a_cpu_machine(accelerator, word) -> None:
    env, note = local_env(_spec(accelerator), devices={"gpu": 0, "tpu": 0})
    assert env["JAX_PLATFORMS"] == "cpu"
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert f"no {word} on this machine" in note and "CPU" in note


def test_gpu_job_env_on_a_gpu_machine() -> None:
    env, note = local_env(_spec("gpu-l4x2"), devices={"gpu": 4, "tpu": 0})
    assert "CUDA_VISIBLE_DEVICES" not in env  # the supervisor sets it once it holds the GPUs
    assert env["JAX_PLATFORMS"] == "cuda"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "on 2 of this machine's 4 GPU(s)" in note
    env, _ = local_env(_spec("cpu"), devices={"gpu": 4, "tpu": 0})
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # the GPUs belong to GPU jobs


def test_gpu_job_really_runs_on_cpu_here(config, backend, caplog) -> None:
    if local_devices()["gpu"]:
        pytest.skip("this machine has GPUs")
    caplog.set_level(logging.INFO, logger="airflow_provider_kinetic")
    request = JobRequest(
        func=report_process, args=(["JAX_PLATFORMS"],), options=JobOptions(accelerator="gpu-l4x4")
    )
    handle, _ = submit_job(request, config, backend)
    assert "no GPU on this machine" in caplog.text
    report = wait_terminal(backend, handle, JobStatus.SUCCEEDED)
    seen = collect(config.store(), handle.job_id, report.status)
    assert seen["env"] == {"JAX_PLATFORMS": "cpu"}
