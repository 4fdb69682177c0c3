"""Deferred GKE jobs in one triggerer share their status reads (issue 23, item 1).

The real ``KineticJobTrigger``s run on one event loop against the Kubernetes API
double (``tests/fixtures/k8s_double.py``, real clients over HTTP) with the shared
readers on a fake clock (``tests/fixtures/triggerer.py``): every request is counted
by the double, every shown log line is captured from the triggers' task logs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends import shared_reads
from airflow_provider_kinetic.core.backends.k8s.manifests import job_name
from airflow_provider_kinetic.core.backends.log_budget import LogBudget
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from tests.fixtures.k8s_double import (
    K8sDouble,
    by_code_under_test,
    forget_log_cursors,
)
from tests.fixtures.triggerer import (
    FakeClock,
    Lines,
    add_queued_job,
    add_running_job,
    backend_for,
    first_event,
    paths,
    trigger_for,
)

POLL_S = 5.0
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"
PODS = "/api/v1/namespaces/{ns}/pods"


@pytest.fixture
async def clock() -> FakeClock:
    fake = FakeClock()
    shared_reads.install(shared_reads.SharedReads(fake))
    return fake


class ReadersClock(FakeClock):
    """:class:`FakeClock` for more than one reader (two namespaces: two readers).

    ``FakeClock`` moves on when the reader that waits has every subscriber waiting, by
    that reader's timeout: with two readers, one can move the clock while the other is
    still answering its subscribers, and the other then skips an interval (8 lists
    instead of 9 here, on a loaded machine).  Here time moves only while every reader
    waits with all its subscribers waiting, and only to the earliest reader's target:
    each reader lists once per interval whatever the scheduling.
    """

    def __init__(self, expect: int = 0) -> None:
        super().__init__(expect)
        #: reader task -> (the clock time it waits for, whether its subscribers all wait)
        self.waiting: dict[Any, tuple[float, Callable[[], bool]]] = {}

    def _all_wait(self) -> bool:
        """Every live reader waits for a later time (one whose time has come is about
        to list), every subscriber of each waits for its answer."""
        readers = [r for r in shared_reads.registry().readers.values() if r.alive]
        waiting = [self.waiting.get(r.task) for r in readers]
        return self._everyone() and all(w and w[0] > self.t and w[1]() for w in waiting)

    async def _run_due(self) -> None:
        while self._due and self._due[0][0] <= self.t:
            await self._due.pop(0)[2]()

    async def wait(self, event: asyncio.Event, timeout: float, settled: Callable[[], bool]) -> None:
        me = asyncio.current_task()
        target = self.t + timeout
        self.waiting[me] = (target, settled)
        try:
            while not (settled() and self._everyone()):
                await asyncio.sleep(0.002)  # timing-ok: the fake clock's own turn of the loop
            if event.is_set() and timeout > 0:
                return  # a new waiter: the reader looks at what is due again
            while self.t < target:
                if self._all_wait():
                    self.t = min(t for t, _ in self.waiting.values() if t > self.t)
                    await self._run_due()
                    for hook in self.on_move:
                        hook(self.t)
                else:
                    await asyncio.sleep(0.002)  # timing-ok: the fake clock waits its readers
            await self._run_due()
        finally:
            del self.waiting[me]


def lists(api: K8sDouble, ns: str = "default") -> tuple[int, int]:
    """(Job lists, pod lists) by the shared selector the code under test sent in ``ns``."""
    sent = [
        r
        for r in by_code_under_test(api.requests)
        if r.method == "GET" and r.params.get("labelSelector") == shared_reads.SELECTOR
    ]
    return (
        sum(1 for r in sent if r.url.path == JOBS.format(ns=ns)),
        sum(1 for r in sent if r.url.path == PODS.format(ns=ns)),
    )


def own_reads(api: K8sDouble, job_id: str, ns: str = "default") -> int:
    """Single-job reads of ``job_id``'s Job."""
    path = paths(job_id, ns)[0]
    return sum(1 for r in by_code_under_test(api.sent("GET")) if r.url.path == path)


def succeed(api: K8sDouble, job_id: str, ns: str = "default") -> Any:
    async def change() -> None:
        await api.patch_status(paths(job_id, ns)[0], {"succeeded": 1})

    return change


async def test_each_trigger_gets_its_own_jobs_status(api: K8sDouble) -> None:
    """Jobs that finish (one way or another), vanish, or live in another namespace."""
    clock = ReadersClock()
    shared_reads.install(shared_reads.SharedReads(clock))
    ok, bad, gone, running = [await add_running_job(api, f"job-000{i}") for i in range(4)]
    other = await add_running_job(api, "job-0009", "other")
    api.forget_requests()
    backend, other_backend = backend_for(api), backend_for(api, "other")

    async def fail_bad() -> None:
        crashed = [{"name": "kinetic-worker",
                    "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]  # fmt: skip
        await api.patch_status(paths(bad.job_id)[1], {"phase": "Failed",
                                                      "containerStatuses": crashed})  # fmt: skip
        await api.patch_status(paths(bad.job_id)[0], {"failed": 1})

    async def delete_gone() -> None:
        resp = await api.delete(paths(gone.job_id)[0])
        assert resp.status == 200

    clock.at(10, succeed(api, ok.job_id))
    clock.at(15, fail_bad)
    clock.at(20, delete_gone)
    clock.at(25, succeed(api, other.job_id, "other"))
    clock.at(40, succeed(api, running.job_id))
    clock.expect = 5
    triggers = [trigger_for(h, backend) for h in (ok, bad, gone, running)]
    triggers.append(trigger_for(other, other_backend))
    events = await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in triggers)), 300)

    got = {e["handle"]["job_id"]: (e["status"], e["reason"]) for e in events}
    assert got == {
        ok.job_id: ("SUCCEEDED", None),
        bad.job_id: ("FAILED", "NonZeroExit"),
        gone.job_id: ("NOT_FOUND", "NotFound"),
        running.job_id: ("SUCCEEDED", None),
        other.job_id: ("SUCCEEDED", None),
    }
    # Only the vanished job was read on its own (once: the read that found it gone).
    assert {j.job_id: own_reads(api, j.job_id) for j in (ok, bad, gone, running)} == {
        ok.job_id: 0, bad.job_id: 0, gone.job_id: 1, running.job_id: 0,
    }  # fmt: skip
    assert own_reads(api, other.job_id, "other") == 0
    # One list per interval: t = 0, 5, ..., 40, never one per trigger (5 here) per interval.
    assert lists(api) == (9, 9)
    assert lists(api, "other") == (6, 6)
    assert shared_reads.registry().readers == {}  # every reader left with its last trigger


async def test_n_triggers_make_one_list_per_interval(api: K8sDouble, clock: FakeClock) -> None:
    handles = [await add_running_job(api, f"job-{i:04d}") for i in range(30)]
    api.forget_requests()
    backend = backend_for(api)
    ticks: list[float] = []
    clock.on_move.append(ticks.append)
    for h in handles:
        clock.at(60, succeed(api, h.job_id))
    clock.expect = len(handles)
    triggers = [trigger_for(h, backend, stream_logs=False) for h in handles]
    events = await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in triggers)), 300)

    assert [e["status"] for e in events] == ["SUCCEEDED"] * 30
    assert ticks == [POLL_S * k for k in range(1, 13)]  # 60 fake seconds, one list each
    job_lists, pod_lists = lists(api)
    assert (job_lists, pod_lists) == (13, 13)  # t = 0 and the 12 ticks, for 30 jobs
    sent = by_code_under_test(api.requests)
    assert len(sent) == 26, Counter(r.url.path for r in sent)  # nothing else at all


class Said(logging.Handler):
    """Every line a trigger wrote into its task log."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_queued_jobs_say_their_kueue_position_from_one_visibility_read(
    api: K8sDouble, clock: FakeClock, tmp_path: Any
) -> None:
    """Three deferred jobs waiting in Kueue queue team-a: each trigger's line says its
    position, from one read of the visibility API for all of them (per minute)."""
    handles = [await add_queued_job(api, f"job-q{i:03d}") for i in range(3)]
    names = [job_name(h.job_id) for h in handles]
    api.pending_workloads[("default", "team-a")] = ["kinetic-job-first", *names]
    workload = f"job-{names[0]}-0c0c0"  # Kueue's name for the first Job's Workload
    request = {
        "metadata": {"name": f"{workload}-dws-1", "ownerReferences": [
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "name": workload,
             "uid": "w"}]},
        "spec": {"provisioningClassName": "queued-provisioning.gke.io", "podSets": []},
        "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                                   "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }  # fmt: skip
    await api.create("/apis/autoscaling.x-k8s.io/v1/namespaces/default/provisioningrequests",
                     request)  # fmt: skip
    api.forget_requests()
    backend = backend_for(api)
    for h in handles:
        clock.at(30, succeed(api, h.job_id))
    clock.expect = len(handles)
    config = config_to_json(KineticConfig(backend="local", root=str(tmp_path)))  # its notes
    said = [Said() for _ in handles]
    triggers = [trigger_for(h, backend, s, config) for h, s in zip(handles, said, strict=True)]
    events = await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in triggers)), 300)

    assert [e["status"] for e in events] == ["SUCCEEDED"] * 3
    for i, (h, s) in enumerate(zip(handles, said, strict=True)):
        line = f"kinetic job {h.job_id}: PENDING (NotAdmitted): waiting for admission: "
        line += f"position {i + 2} of 4 in queue team-a"
        if i == 0:  # its flex-start ProvisioningRequest, in the same line
            line += f"; flex-start request {workload}-dws-1: accepted, waiting for capacity"
        assert line in s.lines, s.lines
    for what in ("pendingworkloads", "provisioningrequests"):
        reads = [r for r in by_code_under_test(api.requests) if what in r.url.path]
        assert len(reads) == 1, what  # one for the three jobs and every poll in the minute
    assert lists(api) == (7, 7)  # the shared lists as before: t = 0, 5, ..., 30


async def test_log_budget_is_fair(api: K8sDouble) -> None:
    """12 chatty jobs, 4 live log reads per interval: each job is read every third
    interval, never twice in one, in turn; when they end every line shows once."""
    clock = FakeClock(expect=12)
    shared_reads.install(shared_reads.SharedReads(clock, LogBudget(calls=4, window_s=POLL_S)))
    handles = [await add_running_job(api, f"job-{i:04d}") for i in range(12)]
    backend = backend_for(api)
    written: dict[str, list[str]] = {h.job_id: [] for h in handles}

    def write(t: float) -> None:  # every job prints a line per interval
        for h in handles:
            line = f"{h.job_id} t={t:g}"
            written[h.job_id].append(line)
            api.write_log("default", f"{job_name(h.job_id)}-p", line)

    write(0)
    api.forget_requests()
    reads_per_window: list[Counter[str]] = []
    seen = [0]

    def account(t: float) -> None:  # the log reads of the interval that just ended
        logs = [r.url.path for r in by_code_under_test(api.requests) if r.url.path.endswith("/log")]
        reads_per_window.append(Counter(p.split("/")[-2] for p in logs[seen[0] :]))
        seen[0] = len(logs)
        write(t)

    clock.on_move.append(account)
    for h in handles:
        clock.at(45, succeed(api, h.job_id))
    lines = Lines()
    clock.expect = len(handles)
    triggers = [trigger_for(h, backend, lines) for h in handles]
    await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in triggers)), 300)

    live = reads_per_window[:9]  # t = 0 .. 40: the jobs still run
    assert all(max(c.values()) == 1 and sum(c.values()) == 4 for c in live), live
    for start in range(0, 9, 3):  # every job once in each three intervals
        served = sum(live[start : start + 3], Counter())
        assert set(served) == {f"{job_name(h.job_id)}-p" for h in handles}, served
    # Finished: each drained once in full, every line once, in order.
    assert {h.job_id: lines.by_job.get(h.job_id) for h in handles} == written


async def test_a_cancelled_trigger_does_not_disturb_the_others(
    api: K8sDouble, clock: FakeClock
) -> None:
    handles = [await add_running_job(api, f"job-{i:04d}") for i in range(5)]
    api.forget_requests()
    backend = backend_for(api)
    clock.expect = len(handles)
    tasks = [asyncio.create_task(first_event(trigger_for(h, backend))) for h in handles]

    async def cancel_one() -> None:
        tasks[2].cancel()

    clock.at(10, cancel_one)
    # A list that fails even after the API retries: those polls read on their own.
    clock.at(15, lambda: _fail_lists(api))
    for h in handles:
        clock.at(30, succeed(api, h.job_id))
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 300)

    assert isinstance(done[2], asyncio.CancelledError)
    assert [e["status"] for i, e in enumerate(done) if i != 2] == ["SUCCEEDED"] * 4
    survivors = [h.job_id for i, h in enumerate(handles) if i != 2]
    assert all(own_reads(api, j) == 1 for j in survivors)  # the failed tick's fallback
    assert own_reads(api, handles[2].job_id) == 0
    assert shared_reads.registry().readers == {}


async def _fail_lists(api: K8sDouble) -> None:
    api.fail("GET", JOBS.format(ns="default"), 500, times=2)  # both attempts of one list


async def test_a_triggerer_restart_loses_no_job_and_repeats_no_line(api: K8sDouble) -> None:
    handles = [await add_running_job(api, f"job-{i:04d}") for i in range(6)]
    backend = backend_for(api)
    for h in handles:
        api.write_log("default", f"{job_name(h.job_id)}-p", *(f"{h.job_id} a{i}" for i in range(5)))
    lines = Lines()

    # The first triggerer: its triggers show some lines, then it goes away.
    clock = FakeClock(expect=len(handles))
    shared_reads.install(shared_reads.SharedReads(clock))
    triggers = [trigger_for(h, backend, lines) for h in handles]
    tasks = [asyncio.create_task(first_event(t)) for t in triggers]
    stopped = asyncio.Event()

    async def stop() -> None:
        stopped.set()

    clock.at(10, stop)
    await asyncio.wait_for(stopped.wait(), 300)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert shared_reads.registry().readers == {}
    assert all(lines.by_job.get(h.job_id) for h in handles)  # some lines were shown
    kwargs = [t.serialize()[1] for t in triggers]

    # More output while no triggerer runs; a new process re-creates the triggers.
    for h in handles:
        api.write_log("default", f"{job_name(h.job_id)}-p", *(f"{h.job_id} b{i}" for i in range(5)))
    forget_log_cursors()
    clock = FakeClock(expect=len(handles))
    shared_reads.install(shared_reads.SharedReads(clock))
    for h in handles:
        clock.at(10, succeed(api, h.job_id))
    again = [trigger_for(k, backend, lines) for k in kwargs]
    events = await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in again)), 300)

    assert [e["status"] for e in events] == ["SUCCEEDED"] * 6
    want = {h.job_id: [f"{h.job_id} {p}{i}" for p in "ab" for i in range(5)] for h in handles}
    assert {h.job_id: lines.by_job[h.job_id] for h in handles} == want


async def test_leaderworkersets_share_one_list_too(api: K8sDouble, clock: FakeClock) -> None:
    from airflow_provider_kinetic.core.backends.k8s.manifests import lws_manifest
    from airflow_provider_kinetic.core.backends.k8s.pathways import PathwaysBackend
    from airflow_provider_kinetic.core.spec.handles import JobHandle
    from tests.fixtures.k8s_double import to_json
    from tests.fixtures.triggerer import WORKER, spec_for

    lws_path = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets"
    handles = []
    for i in range(3):
        spec = spec_for(f"job-lws{i}")
        body = to_json(lws_manifest(spec))
        name = body["metadata"]["name"]
        await api.create(lws_path, body)
        labels = body["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
        meta = {"name": f"{name}-0", "labels": labels}
        containers = [{"name": "kinetic-worker", "image": "img"}]
        await api.create(
            PODS.format(ns="default"), {"metadata": meta, "spec": {"containers": containers}}
        )
        await api.patch_status(f"{PODS.format(ns='default')}/{name}-0",
                               {"phase": "Running", "containerStatuses": WORKER})  # fmt: skip
        handles.append(JobHandle(job_id=spec.job_id, backend="pathways", bucket_name="b",
                                 namespace="default", k8s_name=name))  # fmt: skip
    api.forget_requests()
    backend = PathwaysBackend(api.client_factory())

    def done(name: str) -> Any:
        async def change() -> None:  # the leader finished: Ready (see manifests.lws_manifest)
            ready = [{"type": "Ready", "status": "True"}]
            await api.patch_status(f"{PODS.format(ns='default')}/{name}-0", {"conditions": ready})

        return change

    clock.expect = len(handles)
    for k, h in enumerate(handles):
        clock.at(5 * (k + 1), done(h.k8s_name))
    events = await asyncio.wait_for(
        asyncio.gather(*(first_event(trigger_for(h, backend, stream_logs=False)) for h in handles)),
        300,
    )
    assert [e["status"] for e in events] == ["SUCCEEDED"] * 3
    sent = [r for r in by_code_under_test(api.requests) if r.method == "GET"]
    assert sum(1 for r in sent if r.url.path == lws_path) == 4  # t = 0, 5, 10, 15
    assert not [r for r in sent if r.url.path.startswith(f"{lws_path}/")]  # no single reads


async def test_jobsets_share_one_list_too(api: K8sDouble, clock: FakeClock) -> None:
    """Multi-slice jobs in the triggerer: one list of JobSets (and one of pods) per
    interval answers every trigger, as for Jobs and LeaderWorkerSets."""
    import dataclasses

    from airflow_provider_kinetic.core.backends.k8s.jobset import JobSetBackend
    from airflow_provider_kinetic.core.backends.k8s.manifests import (
        COMPLETION_INDEX,
        JOB_INDEX_LABEL,
        jobset_manifest,
    )
    from airflow_provider_kinetic.core.spec.handles import JobHandle
    from tests.fixtures.k8s_double import to_json
    from tests.fixtures.triggerer import WORKER, spec_for

    path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
    handles = []
    for i in range(3):
        spec = dataclasses.replace(spec_for(f"job-js{i}"), num_slices=2)
        body = to_json(jobset_manifest(spec))
        name = body["metadata"]["name"]
        await api.create(path, body)
        (rjob,) = body["spec"]["replicatedJobs"]
        for s in range(2):  # one host per slice here: the pods' labels are what counts
            labels = {**rjob["template"]["spec"]["template"]["metadata"]["labels"],
                      JOB_INDEX_LABEL: str(s), COMPLETION_INDEX: "0"}  # fmt: skip
            containers = [{"name": "kinetic-worker", "image": "img"}]
            pod = {"metadata": {"name": f"{name}-slice-{s}-0", "labels": labels},
                   "spec": {"containers": containers}}  # fmt: skip
            await api.create(PODS.format(ns="default"), pod)
            await api.patch_status(f"{PODS.format(ns='default')}/{name}-slice-{s}-0",
                                   {"phase": "Running", "containerStatuses": WORKER})  # fmt: skip
        handles.append(JobHandle(job_id=spec.job_id, backend="jobset", bucket_name="b",
                                 namespace="default", k8s_name=name, num_slices=2))  # fmt: skip
    api.forget_requests()
    backend = JobSetBackend(api.client_factory())

    def done(name: str) -> Any:
        async def change() -> None:  # the JobSet controller: every slice's Job completed
            completed = [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]
            await api.patch_status(f"{path}/{name}", {"conditions": completed})

        return change

    clock.expect = len(handles)
    for k, h in enumerate(handles):
        clock.at(5 * (k + 1), done(h.k8s_name))
    events = await asyncio.wait_for(
        asyncio.gather(*(first_event(trigger_for(h, backend, stream_logs=False)) for h in handles)),
        300,
    )
    assert [e["status"] for e in events] == ["SUCCEEDED"] * 3
    sent = [r for r in by_code_under_test(api.requests) if r.method == "GET"]
    assert sum(1 for r in sent if r.url.path == path) == 4  # t = 0, 5, 10, 15
    assert not [r for r in sent if r.url.path.startswith(f"{path}/")]  # no single reads


async def test_a_stale_token_renews_the_shared_client_for_every_trigger(
    api: K8sDouble, clock: FakeClock
) -> None:
    """GKE tokens last an hour: the list that gets a 401 renews the reader's client
    (once), and the triggers' log reads go on with the renewed one."""
    from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend

    handles = [await add_running_job(api, f"job-{i:04d}") for i in range(4)]
    for h in handles:
        api.write_log("default", f"{job_name(h.job_id)}-p", f"{h.job_id} first")
    api.forget_requests()
    factory = api.client_factory("t1", "t2")  # one connection: every trigger's backend

    async def revoke() -> None:
        api.revoked_tokens.add("t1")
        for h in handles:
            api.write_log("default", f"{job_name(h.job_id)}-p", f"{h.job_id} second")

    clock.at(10, revoke)
    for h in handles:
        clock.at(20, succeed(api, h.job_id))
    lines = Lines()
    clock.expect = len(handles)
    triggers = [trigger_for(h, GkeBackend(factory), lines) for h in handles]
    events = await asyncio.wait_for(asyncio.gather(*(first_event(t) for t in triggers)), 300)

    assert [e["status"] for e in events] == ["SUCCEEDED"] * 4
    assert {h.job_id: lines.by_job[h.job_id] for h in handles} == {
        h.job_id: [f"{h.job_id} first", f"{h.job_id} second"] for h in handles
    }
    assert factory.calls == ["t1", "t2"]  # one client, renewed once, for all of them
    logs = [r for r in by_code_under_test(api.requests) if r.url.path.endswith("/log")]
    tokens = Counter(r.headers["Authorization"] for r in logs)
    # Before the revocation (t = 0, 5) on the first client, after it on the renewed one.
    assert tokens["Bearer t1"] == 8 and tokens["Bearer t2"] >= 8 and len(tokens) == 2, tokens
