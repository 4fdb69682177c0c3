"""Poll schedules: fast first polls on the local backend, a cluster's rate unchanged."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time

from airflow_provider_kinetic.core.backends.gke import GkeBackend
from airflow_provider_kinetic.core.backends.local import LocalBackend
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from tests.fixtures import records


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
    from airflow_provider_kinetic.core.accelerators import parse_accelerator
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
    start = time.monotonic()
    backend.wait([handle], 30.0)  # returns when the exit code appears, not after 30 s
    assert time.monotonic() - start < 10 and backend.status(handle).status.value == "SUCCEEDED"
    start = time.monotonic()
    asyncio.run(backend.await_change([handle], 30.0))
    assert time.monotonic() - start < 1
