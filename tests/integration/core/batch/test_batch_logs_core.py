"""``core.batch.logs`` against real backends: a per-poll cap that loses and repeats nothing.

Local: real children (runner subprocesses) print their lines and then wait for the
test to release them, so every line is read while the child runs, under the cap,
with the batch state going through its JSON wire form between polls (a deferral)
and sync (``show``) and trigger (``ashow``) polls alternating.  GKE: the Kubernetes
API double serves the pods' logs (offsets count lines there, bytes locally).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.gcp.gke_auth import (
    ClusterEndpoint,
    GkeApiClientFactory,
    GoogleTokenSource,
)
from tests.fixtures import records
from tests.fixtures.google_creds import FakeCredentials
from tests.fixtures.k8s_double import K8sDouble
from tests.integration.core.backends.k8s.test_gke_batch_status import (
    JOBS,
    NS,
    PODS,
    child_job,
    now,
    worker,
)

CAP = 100
LINES = 25


def talk_then_wait(i: int, release: str) -> int:
    """LINES lines of 31 bytes, then wait (polling a file) until the test releases it."""
    import os
    import time

    for j in range(25):
        print(f"child {i} says line {j:03d} -----", flush=True)
    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    return i


def got_emitter(got: dict[int, list[str]]):  # noqa: ANN201 - an Emit
    """An ``emit`` that collects lines per child into ``got``."""
    return lambda index, line, ns: got[index].append(line)


def rewire(state: BatchState) -> BatchState:
    """The state as the next poll sees it after a deferral: through JSON and back."""
    return BatchState.from_dict(json.loads(json.dumps(state.to_dict())))


def poll(state: BatchState, backend, reports, n: int) -> dict[int, list[str]]:
    """One poll, sync (``show``) or trigger-side (``ashow``) by turns."""
    got: dict[int, list[str]] = defaultdict(list)

    def emit(index: int, line: str, ns: int | None = None) -> None:
        got[index].append(line)

    if n % 2:
        asyncio.run(batchlogs.ashow(state, backend, reports, emit, CAP))
    else:
        batchlogs.show(state, backend, reports, emit, CAP)
    return got


def test_local_children_lines_once_in_order_under_a_small_cap(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "store"))
    config = KineticConfig(backend="local", root=store.bucket)
    backend = LocalBackend(store.bucket)
    release = tmp_path / "release"
    request = JobRequest(
        func=talk_then_wait, kwargs={"release": str(release)}, output_dir=store.uri("out")
    )
    state, objects, local = plan_batch(
        request, [0, 1], "single", store, config=config, max_concurrent=2, retries=0,
        fail_fast=False,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    batchlaunch.launch(state, config, backend, store)
    seen: dict[int, list[str]] = defaultdict(list)
    polls_with_lines, n = 0, 0
    try:
        deadline = time.monotonic() + 120
        while any(sum("says" in x for x in seen[i]) < LINES for i in (0, 1)):
            assert time.monotonic() < deadline, dict(seen)
            reports = backend.batch_status(state.group_id, list(state.active.values()))
            assert all(r.status in (JobStatus.PENDING, JobStatus.RUNNING) for r in reports.values())
            got = poll(state, backend, reports, n)
            for index, lines in got.items():
                assert sum(len(x.encode()) + 1 for x in lines) <= CAP or len(lines) == 1
                seen[index] += lines
            polls_with_lines += bool(got)
            state, n = rewire(state), n + 1
            backend.wait(list(state.active.values()), 0.05)
    finally:
        release.touch()
    while not state.finished:  # released: each child ends; its rest is drained once
        backend.wait(list(state.active.values()), 0.05)
        reports = backend.batch_status(state.group_id, list(state.active.values()))
        for index, lines in poll(state, backend, reports, 0).items():
            seen[index] += lines
        batchrun.observe(state, reports, backend, store)
    for i in (0, 1):
        says = [x for x in seen[i] if "says" in x]
        assert says == [f"child {i} says line {j:03d} -----" for j in range(LINES)]
    assert polls_with_lines >= LINES * 32 // CAP  # the cap split the log over many polls
    assert state.log_offsets == {}  # nothing kept for finished children


async def test_gke_pod_logs_capped_once_in_order_and_failed_tail(api: K8sDouble) -> None:
    endpoint = ClusterEndpoint(host=str(api.url).rstrip("/"))
    backend = GkeBackend(GkeApiClientFactory(endpoint, GoogleTokenSource(FakeCredentials())))
    group_id = "grp-0000feed"
    handles, pods = {}, {}
    for index in (0, 1):
        job = child_job(group_id, index)
        name = job["metadata"]["name"]
        await api.create(JOBS, job)
        template = job["spec"]["template"]
        meta = {**template["metadata"], "name": f"{name}-pod", "creationTimestamp": now()}
        await api.create(PODS, {"metadata": meta, "spec": template["spec"]})
        running = {"phase": "Running", "containerStatuses": worker(running={}), "startTime": now()}
        await api.patch_status(f"{PODS}/{meta['name']}", running)
        job_id = job["metadata"]["labels"]["job-id"]
        handles[index] = records.handle(job_id, "bkt", "gke", namespace=NS, k8s_name=name)
        pods[index] = meta["name"]
    state = records.batch_state(
        2, {i: h.job_id for i, h in handles.items()}, backend="gke", group_id=group_id
    )
    state.active = dict(handles)
    expected: dict[int, list[str]] = {0: [], 1: []}
    seen: dict[int, list[str]] = defaultdict(list)
    running = {h.job_id: StatusReport(JobStatus.RUNNING) for h in handles.values()}

    async def drain(reports) -> int:
        nonlocal state
        polls = 0
        while any(seen[i] != expected[i] for i in (0, 1)) or polls == 0:
            assert polls < 50, dict(seen)
            got: dict[int, list[str]] = defaultdict(list)
            emit = got_emitter(got)
            if polls % 2:
                await batchlogs.ashow(state, backend, reports, emit, CAP)
            else:
                await asyncio.to_thread(batchlogs.show, state, backend, reports, emit, CAP)
            for index, lines in got.items():
                assert sum(len(x.encode()) + 1 for x in lines) <= CAP
                seen[index] += lines
            state, polls = rewire(state), polls + 1
        return polls

    for rounds in range(2):  # lines keep coming while the children run
        for index in (0, 1):
            new = [f"pod {index} round {rounds} line {j:02d}" for j in range(15)]
            api.write_log(NS, pods[index], *new)
            expected[index] += new
        assert await drain(running) >= 15 * 26 // CAP
        assert dict(seen) == expected  # once each, in order, nothing from the other pod

    # Child 1 fails: its remaining lines are drained and its last 20 lines kept.
    api.write_log(NS, pods[1], "the last words")
    expected[1].append("the last words")
    failed = {**running, handles[1].job_id: StatusReport(JobStatus.FAILED, "exit code 1")}
    await drain(failed)
    assert dict(seen) == expected
    assert state.log_tails == {1: expected[1][-20:]}
    assert 1 not in state.log_offsets and 0 in state.log_offsets
    summary = batchlogs.failure_summary(state, {1: RuntimeError("exit code 1")})
    assert "last 20 log lines of inputs[1]:" in summary
    assert summary.rstrip().endswith("[child 1] the last words")
    # Only the last 20 of its 31 lines.
    assert "[child 1] pod 1 round 0 line 11" in summary
    assert "pod 1 round 0 line 10" not in summary and "pod 0 " not in summary
