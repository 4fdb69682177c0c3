"""Poll schedules: fast first polls on the local backend, a cluster's rate unchanged."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from tests.fixtures import records

#: A wait's own timeout: one that returns within WAKE_DEADLINE_S was woken by the job.
HOUR_S = 3600.0
#: Generous for a loaded machine, and far below HOUR_S (no clock is read by the tests).
WAKE_DEADLINE_S = 120.0


def test_local_polls_start_fast_and_settle_at_the_interval():
    delays = list(itertools.islice(poll_delays(5.0, LocalBackend.first_poll_s), 8))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_cluster_polls_keep_their_rate():
    """GKE: every poll_interval from the start, so a 10-minute job makes exactly the
    polls it made before (121 status reads at 5 s, the first one at submission)."""
    assert GkeBackend.first_poll_s is None
    delays = poll_delays(5.0, GkeBackend.first_poll_s)
    elapsed, polls = 0.0, 1
    while (elapsed := elapsed + next(delays)) <= 600:
        polls += 1
    assert polls == 121


def test_local_wait_wakes_when_the_job_exits(tmp_path):
    import threading

    from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
    from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec

    spec = build_job_spec(
        SpecInputs(
            job_id="job-0000beef", bucket=str(tmp_path), context_uri="c", payload_uri="p",
            result_uri="r", payload_sha256="0", context_sha256="0",
            accelerator=parse_accelerator("cpu"), image="i", output_dir=str(tmp_path),
            runner_command=[sys.executable, "-c", "pass"],
        )
    )  # fmt: skip
    spec.container["args"] = []
    backend = LocalBackend(str(tmp_path))
    backend.submit(spec)
    handle = records.handle("job-0000beef", str(tmp_path))
    # An hour's wait that ends within WAKE_DEADLINE_S ended with the job, not its timeout.
    waiter = threading.Thread(target=backend.wait, args=([handle], HOUR_S), daemon=True)
    waiter.start()
    waiter.join(WAKE_DEADLINE_S)
    assert not waiter.is_alive(), "the wait did not end when the job exited"
    assert backend.status(handle).status.value == "SUCCEEDED"
    # The job has ended: the trigger's wait returns at once (TimeoutError if it waited).
    asyncio.run(asyncio.wait_for(backend.await_change([handle], HOUR_S), WAKE_DEADLINE_S))


def _waiting_job(tmp_path, job_id: str, go: str) -> tuple[LocalBackend, object]:
    """A real local job (supervisor + child) that runs until ``go`` exists."""
    from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
    from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec

    code = f"import os, time\nwhile not os.path.exists({go!r}):\n    time.sleep(0.01)\n"
    spec = build_job_spec(
        SpecInputs(
            job_id=job_id, bucket=str(tmp_path), context_uri="c", payload_uri="p",
            result_uri="r", payload_sha256="0", context_sha256="0",
            accelerator=parse_accelerator("cpu"), image="i", output_dir=str(tmp_path),
            runner_command=[sys.executable, "-c", code],
        )
    )  # fmt: skip
    spec.container["args"] = []
    backend = LocalBackend(str(tmp_path))
    backend.submit(spec)
    return backend, records.handle(job_id, str(tmp_path))


def test_waits_wake_on_the_supervisors_exit_through_a_pidfd(tmp_path):
    """A running job is watched through its supervisor's pidfd: the sync wait and the
    trigger's wait return when it ends (its exit code already written), long before
    their hour; a pid that is not the job's supervisor is never watched."""
    import threading

    from airflow_provider_kinetic.core.backends.local import wake as local_wake

    go = str(tmp_path / "go")
    backend, handle = _waiting_job(tmp_path, "job-0000cafe", go)
    jdir = backend.job_dir(handle.job_id)
    fds = local_wake.open_pidfds([jdir])
    assert fds is not None and len(fds) == 1
    local_wake.close(fds)
    waiter = threading.Thread(target=backend.wait, args=([handle], HOUR_S), daemon=True)
    waiter.start()
    open(go, "w").close()
    waiter.join(WAKE_DEADLINE_S)
    assert not waiter.is_alive()
    assert backend.status(handle).status.value == "SUCCEEDED"
    assert local_wake.open_pidfds([jdir]) is local_wake.GONE  # ended: a change, not a watch
    # A pid file naming another process (this one) is not a supervisor of the job.
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "pid").write_text(str(os.getpid()))
    assert local_wake.open_pidfds([str(stranger)]) is local_wake.GONE  # never watched
    assert local_wake.open_pidfds([jdir] * (local_wake.MAX_PIDFDS + 1)) is None

    go2 = str(tmp_path / "go2")
    backend, handle = _waiting_job(tmp_path, "job-0000f00d", go2)

    async def trigger_wait() -> None:
        task = asyncio.ensure_future(backend.await_change([handle], HOUR_S))
        await asyncio.sleep(0)  # let it start watching
        open(go2, "w").close()
        await asyncio.wait_for(task, WAKE_DEADLINE_S)  # TimeoutError: it did not wake

    asyncio.run(trigger_wait())
    assert backend.status(handle).status.value == "SUCCEEDED"


def test_a_killed_supervisor_ends_the_wait(tmp_path):
    """No exit code is ever written when the supervisor is SIGKILLed: its pidfd still
    ends the wait (no spin, not its hour), and the job reads as FAILED."""
    import threading

    backend, handle = _waiting_job(tmp_path, "job-0000dead", str(tmp_path / "never"))
    pid = int((tmp_path / ".local-jobs" / handle.job_id / "pid").read_text())
    waiter = threading.Thread(target=backend.wait, args=([handle], HOUR_S), daemon=True)
    waiter.start()
    os.killpg(pid, signal.SIGKILL)
    waiter.join(WAKE_DEADLINE_S)
    assert not waiter.is_alive()
    assert backend.status(handle).status.value == "FAILED"
    backend.release(handle)  # its temp dir: a killed supervisor could not remove it
