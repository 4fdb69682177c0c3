"""Metrics: the core's sink (a no-op until one is set, resolved once, scoped tags),
Airflow's stats client behind it (milliseconds, clean tags, nothing outside a task,
nothing made with ``[metrics]`` off) and the call sites (data cache, stat cache, API
retries, results, a batch's preemptions and capacity steps, a task's usage)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.backends.k8s.status import REASON_PREEMPTED
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.data import Data, content_hash_of
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data.hashing.statcache import StatCache
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.jobs.results import collect_with_blob
from airflow_provider_kinetic.core.jobs.usage import for_jobs, summary_line, total
from airflow_provider_kinetic.core.spec.handles import (
    REASON_NO_CAPACITY,
    JobHandle,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment import metrics as airflow_metrics
from airflow_provider_kinetic.deployment.usage import send_metrics
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.records import batch_state, handle


class Recording:
    """A sink that keeps what it is given: (kind, name, value, tags)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float, dict[str, str]]] = []

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        self.sent.append(("incr", name, count, dict(tags)))

    def timing(self, name: str, seconds: float, tags: Mapping[str, str]) -> None:
        self.sent.append(("timing", name, seconds, dict(tags)))

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        self.sent.append(("gauge", name, value, dict(tags)))

    def named(self, name: str) -> list[tuple[float, dict[str, str]]]:
        return [(value, tags) for _, n, value, tags in self.sent if n == name]


@pytest.fixture
def saved() -> Iterator[None]:
    """The process's sink and resolver as they were, whatever a test sets."""
    before = metrics._sink, metrics._resolver
    yield
    metrics._sink, metrics._resolver = before


@pytest.fixture
def sink(saved: None) -> Recording:
    recording = Recording()
    metrics.install(recording)
    return recording


# ---- core.metrics ------------------------------------------------------------------


def test_without_a_sink_every_call_is_a_no_op_that_allocates_nothing(saved):
    metrics.install(None)
    assert not metrics.enabled()
    for _ in range(1000):  # warm up
        metrics.incr("kinetic.data.cache_hits")
    before = sys.getallocatedblocks()
    for _ in range(100_000):
        metrics.incr("kinetic.data.cache_hits")
        metrics.timing("kinetic.job.run", 1.0)
        metrics.gauge("kinetic.x", 2.0)
    assert sys.getallocatedblocks() - before < 20


def test_the_resolver_runs_once_on_first_use_from_any_thread(saved):
    calls, recording = [], Recording()

    def resolver() -> Recording:
        calls.append(1)
        return recording

    metrics.install(None)
    metrics.set_resolver(resolver)
    assert calls == []  # registering costs nothing
    threads = [threading.Thread(target=metrics.incr, args=("kinetic.t",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and len(recording.named("kinetic.t")) == 8
    metrics.set_resolver(resolver)  # an installed sink stays
    metrics.incr("kinetic.t")
    assert calls == [1]


@pytest.mark.parametrize("answer", ["off", "raises"])
def test_a_resolver_that_says_off_or_fails_turns_metrics_off_for_good(saved, answer):
    calls = []

    def resolver() -> None:
        calls.append(1)
        if answer == "raises":
            raise RuntimeError("no client")
        return None

    metrics.install(None)
    metrics.set_resolver(resolver)
    assert not metrics.enabled()
    metrics.incr("kinetic.t")
    assert calls == [1] and metrics._resolver is None


def test_a_failing_sink_never_reaches_the_caller(saved):
    class Broken(Recording):
        def incr(self, *_: Any) -> None:
            raise OSError("socket gone")

    metrics.install(Broken())
    metrics.incr("kinetic.t")  # no exception


def test_call_tags_override_the_scope_and_scopes_stay_in_their_task(sink):
    async def trigger(name: str) -> None:
        metrics.set_scope({"dag_id": name, "backend": "gke"})
        await asyncio.sleep(0)
        metrics.incr("kinetic.t", 1, {"backend": "local"})

    async def both() -> None:
        await asyncio.gather(trigger("a"), trigger("b"))

    asyncio.run(both())
    assert sorted((t["dag_id"], t["backend"]) for _, t in sink.named("kinetic.t")) == [
        ("a", "local"),
        ("b", "local"),
    ]
    metrics.incr("kinetic.u")
    assert sink.named("kinetic.u") == [(1, {})]  # nothing leaked out of the tasks


# ---- call sites ----------------------------------------------------------------------


def test_data_uploads_count_misses_bytes_and_files_then_hits_in_the_callers_scope(
    sink, tmp_path: Path
):
    tree = tmp_path / "data"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.bin").write_bytes(b"a" * 1000)
    (tree / "sub" / "b.bin").write_bytes(b"b" * 234)
    store = LocalStore(str(tmp_path / "store"))
    token = metrics.set_scope({"dag_id": "d", "task_id": "t"})
    try:
        datacache.upload_all(store, [Data(str(tree))])
        datacache.upload_all(store, [Data(str(tree))])
    finally:
        metrics.reset_scope(token)
    scoped = {"dag_id": "d", "task_id": "t"}
    assert sink.named("kinetic.data.cache_misses") == [(1, scoped)]
    assert sink.named("kinetic.data.uploaded_bytes") == [(1234, scoped)]
    assert sink.named("kinetic.data.uploaded_files") == [(2, scoped)]
    assert sink.named("kinetic.data.cache_hits") == [(1, scoped)]  # from a pool thread too


def test_a_stat_cache_record_found_is_a_hit(sink, tmp_path: Path):
    tree = tmp_path / "data"
    tree.mkdir()
    (tree / "a.bin").write_bytes(b"a" * 10)
    cache = StatCache(str(tmp_path / "cache"), clock=lambda: time.time_ns() + 10**10)
    first = content_hash_of(str(tree), stat_cache=cache)
    assert sink.named("kinetic.data.stat_cache_hits") == []  # nothing recorded yet
    assert content_hash_of(str(tree), stat_cache=cache) == first
    assert sink.named("kinetic.data.stat_cache_hits") == [(1, {})]


def test_a_collected_result_counts_its_bytes(sink, tmp_path: Path):
    store = LocalStore(str(tmp_path))
    blob, _ = dump_result(make_result(success=True, result="x" * 500, exception=None, traceback=""))
    store.write_bytes("job-1/result.pkl", blob)
    value, got = collect_with_blob(store, "job-1", JobStatus.SUCCEEDED)
    assert value == "x" * 500 and sink.named("kinetic.job.result_bytes") == [(len(got), {})]


def test_a_batch_counts_preemptions_and_capacity_steps_as_they_happen(sink, tmp_path: Path):
    class Quiet(LocalBackend):
        def __init__(self) -> None:
            super().__init__("/nonexistent")

        def cancel(self, handle: JobHandle) -> None:
            pass

    store = LocalStore(str(tmp_path))
    s = batch_state(2, {0: "job-p", 1: "job-r"}, retries=0)
    s.template.options = s.template.options.but(capacity=["reservation:r1", "spot"])
    s.active = {0: handle("job-p", capacity="spot"), 1: handle("job-r", capacity="reservation:r1")}
    reports = {
        "job-p": StatusReport(JobStatus.FAILED, REASON_PREEMPTED),
        "job-r": StatusReport(JobStatus.FAILED, REASON_NO_CAPACITY, "nothing started"),
    }
    batchrun.observe(s, reports, Quiet(), store)
    assert sink.named("kinetic.job.preemptions") == [(1, {"capacity": "spot"})]
    assert sink.named("kinetic.job.capacity_steps") == [(1, {"capacity": "reservation:r1"})]


def test_kubernetes_api_retries_are_counted_per_call_and_status(sink, monkeypatch):
    from airflow_provider_kinetic.core.backends.k8s import retry as k8s_retry
    from airflow_provider_kinetic.core.backends.k8s.retry import Answer, RetryPolicy

    answers = iter([Answer(503, b""), Answer(429, b""), Answer(200, b"{}")])
    monkeypatch.setattr(k8s_retry, "call_sync", lambda _client, _call: next(answers))

    class Call:
        api, method, args, kwargs = "BatchV1Api", "read_namespaced_job", (), {}

    policy = RetryPolicy(sleep=lambda _s: None)
    assert k8s_retry.send(Call(), lambda: object(), lambda _c: None, policy).status == 200
    assert sink.named("kinetic.k8s.api_retries") == [
        (1, {"call": "BatchV1Api.read_namespaced_job", "status": "503"}),
        (1, {"call": "BatchV1Api.read_namespaced_job", "status": "429"}),
    ]


# ---- the task's usage -> job metrics -------------------------------------------------


def attempt(job_id: str, try_number: int, **fields: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "kind": "job",
        "dag_id": "d",
        "task_id": "t",
        "try_number": try_number,
        "state": "SUCCEEDED",
        "accelerator": "gpu-l4x1",
        "capacity": "spot",
        "jobs": 1,
        "measured_jobs": 1,
        "running": False,
        "preempted": False,
        "queued_s": 2.0,
        "run_s": 10.0,
        "chip_hours": 10.0 / 3600,
        **fields,
    }


def entry(store: LocalStore, job_id: str, state: str, reason: str | None = None) -> None:
    ids = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1}
    history.submitted(store, job_id, ids, backend="gke", accelerator="gpu-l4", func="f",
                      output_dir=None)  # fmt: skip
    history.update(store, job_id, state, reason)


def test_usage_sends_each_ended_job_of_this_try_once(sink, tmp_path: Path):
    store = LocalStore(str(tmp_path))
    entry(store, "job-old", "FAILED")
    entry(store, "job-step", history.CANCELLED, f"{REASON_NO_CAPACITY}: no nodes")
    entry(store, "job-pre", "PREEMPTED")
    entry(store, "job-last", "SUCCEEDED")
    usage = {
        "attempts_detail": [
            attempt("job-old", 1, state="FAILED"),  # the earlier try sent it
            attempt(
                "job-step",
                2,
                state=history.CANCELLED,
                capacity="reservation:r1",
                run_s=None,
                chip_hours=None,
            ),  # fmt: skip
            attempt("job-pre", 2, state="PREEMPTED", preempted=True),
            attempt("job-last", 2),
        ]
    }
    send_metrics(store, usage, ["job-old", "job-step", "job-pre", "job-last"], 2)
    ended = sink.named("kinetic.job.ended")
    assert [(t["state"], t["capacity"], t["backend"]) for _, t in ended] == [
        (history.CANCELLED, "reservation:r1", "gke"),
        ("PREEMPTED", "spot", "gke"),
        ("SUCCEEDED", "spot", "gke"),
    ]
    assert [v for v, _ in sink.named("kinetic.job.run")] == [10.0, 10.0]
    assert [v for v, _ in sink.named("kinetic.job.queued")] == [2.0, 2.0, 2.0]
    assert [v for v, _ in sink.named("kinetic.job.chip_seconds")] == [10, 10]
    assert [t["capacity"] for _, t in sink.named("kinetic.job.capacity_steps")] == [
        "reservation:r1"
    ]
    assert len(sink.named("kinetic.job.preemptions")) == 1
    tags = ended[-1][1]
    assert {k: tags[k] for k in ("dag_id", "task_id", "accelerator", "kind")} == {
        "dag_id": "d",
        "task_id": "t",
        "accelerator": "gpu-l4x1",
        "kind": "job",
    }


def test_usage_of_a_batch_sends_the_mean_per_child_and_counts_its_children(sink, tmp_path):
    store = LocalStore(str(tmp_path))
    entry(store, "grp", "SUCCEEDED")
    batch = attempt("grp", 1, kind="batch", jobs=4, measured_jobs=4, queued_s=8.0, run_s=40.0,
                    preemptions=2, preempted=True)  # fmt: skip
    send_metrics(store, {"attempts_detail": [batch]}, ["grp"], 1)
    assert sink.named("kinetic.job.ended")[0][0] == 4
    assert [v for v, _ in sink.named("kinetic.job.run")] == [10.0]
    assert [v for v, _ in sink.named("kinetic.job.queued")] == [2.0]
    assert sink.named("kinetic.job.preemptions") == []  # counted live by observe()


# ---- hooks.metrics: Airflow's stats client ---------------------------------------------


class FakeStats:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, dict[str, str]]] = []

    def incr(self, name: str, count: int = 1, *, tags: dict[str, str]) -> None:
        self.calls.append(("incr", name, count, tags))

    def timing(self, name: str, dt: float, *, tags: dict[str, str]) -> None:
        self.calls.append(("timing", name, dt, tags))

    def gauge(self, name: str, value: float, *, tags: dict[str, str]) -> None:
        self.calls.append(("gauge", name, value, tags))


def test_the_airflow_sink_sends_milliseconds_and_clean_tags(monkeypatch):
    stats = FakeStats()
    monkeypatch.setattr(airflow_metrics, "_task_tags", lambda: {})
    sink = airflow_metrics.AirflowStatsSink(stats)
    tags = {"dag_id": "d", "task_id": "t", "capacity": "reservation:r1", "backend": None}
    sink.timing("kinetic.job.run", 1.5, tags)  # type: ignore[arg-type]
    sink.incr("kinetic.job.ended", 2, tags)  # type: ignore[arg-type]
    clean = {"dag_id": "d", "task_id": "t", "capacity": "reservation_r1"}
    assert stats.calls == [
        ("timing", "kinetic.job.run", 1500.0, clean),
        ("incr", "kinetic.job.ended", 2, clean),
    ]


def test_the_airflow_sink_takes_the_running_task_and_drops_metrics_outside_one(monkeypatch):
    stats = FakeStats()
    sink = airflow_metrics.AirflowStatsSink(stats)
    monkeypatch.setattr(airflow_metrics, "_task_tags", lambda: {})
    sink.incr("kinetic.data.cache_hits", 1, {})
    assert stats.calls == []  # the CLI, the Kinetic page: no task, not sent
    task = {"dag_id": "d", "task_id": "t", "accelerator": "cpu", "backend": "local"}
    monkeypatch.setattr(airflow_metrics, "_task_tags", lambda: dict(task))
    sink.incr("kinetic.data.cache_hits", 1, {})
    assert stats.calls == [("incr", "kinetic.data.cache_hits", 1, task)]


def test_task_tags_come_from_the_operator(monkeypatch):
    from airflow.sdk.definitions._internal import contextmanager as ctx

    class Task:
        _backend = LocalBackend("/nonexistent")

        def accelerator_spec(self) -> str:
            return "gpu-l4:spot"

    monkeypatch.setattr(ctx, "_CURRENT_CONTEXT", [{"ti": FakeTI(), "task": Task()}])
    assert airflow_metrics._task_tags() == {
        "dag_id": "d",
        "task_id": "t",
        "accelerator": "gpu-l4x1",
        "backend": "local",
    }
    monkeypatch.setattr(ctx, "_CURRENT_CONTEXT", [])
    assert airflow_metrics._task_tags() == {}


def test_with_metrics_off_no_client_is_made(monkeypatch):
    made: list[Any] = []
    monkeypatch.setattr(airflow_metrics, "_initialize", made.append)  # Airflow's, untouched
    for key in airflow_metrics.SWITCHES:
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key.upper()}", "False")
    assert airflow_metrics.resolve() is None and made == []
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    assert isinstance(airflow_metrics.resolve(), airflow_metrics.AirflowStatsSink)
    assert len(made) == 1


def test_a_trigger_scope_tags_its_task(saved):
    metrics.install(Recording())

    class Trigger:
        task_instance = None

    async def run() -> dict[str, str]:
        airflow_metrics.trigger_scope(
            Trigger(), {"dag_id": "d", "task_id": "t"}, "tpu-v6e-8", "gke"
        )
        return dict(metrics._scope.get())

    assert asyncio.run(run()) == {
        "accelerator": "tpu-v6e-8",
        "backend": "gke",
        "dag_id": "d",
        "task_id": "t",
    }


def test_a_failed_jobs_metrics_carry_its_failure_class(sink, tmp_path: Path):
    store = LocalStore(str(tmp_path))
    entry(store, "job-bug", "FAILED")
    failure = {"class": "user_error", "phase": "execute", "job_id": "job-bug"}
    history.update(store, "job-bug", failure=failure)
    usage = for_jobs(store, ["job-bug"])
    detail = [attempt("job-bug", 1, state="FAILED", failure_class="user_error")]
    assert usage["attempts_detail"][0]["failure_class"] == "user_error"
    send_metrics(store, {"attempts_detail": detail}, ["job-bug"], 1)
    ((_, ended),) = sink.named("kinetic.job.ended")
    ((_, chips),) = sink.named("kinetic.job.chip_seconds")
    assert ended["failure_class"] == chips["failure_class"] == "user_error"
    line = summary_line({**total(detail), "family": "l4"})
    assert "failed: 1 user_error (0.0028 chip-hours)" in line
