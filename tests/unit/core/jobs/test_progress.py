"""Progress from inside a job's function (``core/jobs/progress*.py``): the update's
checks and text, the writer's throttle on a fake clock, and the waiting side's lines."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_provider_kinetic.core import metrics
from airflow_provider_kinetic.core.jobs import progress_report
from airflow_provider_kinetic.core.jobs.progress import (
    PROGRESS_URI_ENV,
    READ_EVERY_S,
    Progress,
    ProgressWatch,
    progress_key,
    read_progress,
)
from airflow_provider_kinetic.core.jobs.progress_report import Reporter
from airflow_provider_kinetic.core.storage import LocalStore


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    (tmp_path / "job1").mkdir()
    return LocalStore(str(tmp_path))


def stored(store) -> dict | None:
    try:
        return json.loads(store.read_bytes(progress_key("job1")))
    except Exception:  # noqa: BLE001
        return None


def test_the_text_has_the_step_percent_eta_and_metrics():
    first = Progress.checked(0, 10_000, at=0.0)
    now = Progress.checked(1_200, 10_000, {"loss": 0.2312}, "epoch 2", at=330.0, first=first)
    # 1,200 steps in 330 s: 8,800 left take 2,420 s, about 40 min
    assert now.describe() == "step 1,200/10,000 (12%), ETA 40 min, loss 0.2312, epoch 2"
    assert now.fraction == pytest.approx(0.12)
    assert Progress.checked(5, at=1.0).describe() == "step 5"  # no total: no percent, no ETA
    done = Progress.checked(10, 10, at=9.0, first=Progress.checked(0, 10, at=0.0))
    assert done.describe() == "step 10/10 (100%)"
    long = Progress.checked(1, 100, at=7_200.0, first=Progress.checked(0, 100, at=0.0))
    assert "ETA 198 h 00 min" in long.describe()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("x",), "'x'"),
        ((True,), "True"),
        ((-1,), "-1"),
        ((1, 0), "total must be > 0"),
        ((1, None, {"loss": "low"}), "'low'"),
        ((1, None, {"loss": float("nan")}), "nan"),
        ((1, None, [1]), "[1]"),
        ((1, None, None, 3), "message"),
    ],
)
def test_a_bad_update_fails_naming_the_value(args, named):
    with pytest.raises((TypeError, ValueError), match=named.replace("[", r"\[")):
        Progress.checked(*args, at=0.0)


def test_numpy_scalars_are_numbers_and_stored_as_plain_ones():
    np = pytest.importorskip("numpy")
    update = Progress.checked(np.int64(3), np.int32(10), {"loss": np.float32(0.5)}, at=1.0)
    assert (type(update.step), type(update.total)) == (int, int)
    assert json.dumps(update.to_dict())  # JSON as it is written
    assert update.metrics == {"loss": 0.5} and type(update.metrics["loss"]) is float


def test_the_writer_writes_at_most_once_per_interval_and_the_last_at_flush(store):
    clock = Clock()
    writer = Reporter(store, progress_key("job1"), min_interval=5.0, clock=clock)
    assert writer.update(1, 100) is True  # the first: at once
    for step in range(2, 50):  # many updates within the interval: none written
        clock.now += 0.1
        assert writer.update(step, 100) is False
    assert (writer.writes, stored(store)["step"]) == (1, 1)
    clock.now = 1_005.0  # the interval has passed: the next update is written
    assert writer.update(50, 100, {"loss": 0.5}) is True
    assert (writer.writes, stored(store)["step"]) == (2, 50)
    clock.now += 1
    writer.update(51, 100)
    assert writer.flush() is True and stored(store)["step"] == 51  # the last: always
    assert writer.flush() is False and writer.writes == 3  # nothing pending: no write
    assert stored(store)["first_step"] == 1 and stored(store)["first_at"] == 1_000.0


def test_a_write_that_fails_never_raises(tmp_path, caplog):
    store = LocalStore(str(tmp_path))  # no job dir: a local store that is away
    writer = Reporter(store, progress_key("job1"), clock=Clock())
    assert writer.update(1) is True and writer.writes == 0
    assert not (tmp_path / "job1").exists()  # not recreated

    class Broken(LocalStore):
        def write_bytes(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            raise OSError("disk full")

    (tmp_path / "job1").mkdir()
    with caplog.at_level(logging.WARNING, "kinetic.progress"):
        Reporter(Broken(str(tmp_path)), progress_key("job1"), clock=Clock()).update(1)
    assert "could not write progress" in caplog.text and "disk full" in caplog.text


def test_update_outside_a_job_warns_once_and_still_checks(monkeypatch, caplog):
    monkeypatch.delenv(PROGRESS_URI_ENV, raising=False)
    monkeypatch.setattr(progress_report, "_warned", False)
    monkeypatch.setattr(progress_report, "_reporter", None)
    from airflow_provider_kinetic import progress

    with caplog.at_level(logging.WARNING, "kinetic.progress"):
        progress.update(1, 10)
        progress.update(2, 10)
    assert caplog.text.count("outside a kinetic job") == 1
    with pytest.raises(TypeError, match="'two'"):
        progress.update("two")


def test_update_in_a_job_writes_where_the_runner_says(store, monkeypatch):
    monkeypatch.setattr(progress_report, "_reporter", None)
    monkeypatch.setenv(PROGRESS_URI_ENV, store.uri(progress_key("job1")))
    from airflow_provider_kinetic import progress

    progress.update(3, 4, {"acc": 0.9})
    assert stored(store)["step"] == 3 and read_progress(store, "job1").metrics == {"acc": 0.9}
    monkeypatch.setenv(PROGRESS_URI_ENV, "-")  # a worker host: dropped, silently
    progress.update(4, 4)
    assert stored(store)["step"] == 3


def test_the_watch_shows_a_line_when_the_step_or_a_metric_changes(store):
    class Gauges:
        def __init__(self) -> None:
            self.sent: list[tuple[str, float]] = []

        def gauge(self, name, value, tags):  # noqa: ANN001, ANN201
            self.sent.append((name, value))

    sink = Gauges()
    metrics.install(sink)  # type: ignore[arg-type]
    try:
        clock = Clock()
        watch = ProgressWatch(store, "job1", clock=clock)
        assert watch.poll() is None  # nothing reported yet
        writer = Reporter(store, progress_key("job1"), min_interval=0, clock=clock)
        writer.update(0, 8, {"loss": 1.0})
        assert not watch.due() and watch.due(final=True)
        assert watch.poll() is None  # read at most every READ_EVERY_S: not read now
        clock.now += READ_EVERY_S
        assert watch.poll() == "step 0/8 (0%), loss 1"
        clock.now += READ_EVERY_S
        assert watch.poll() is None  # unchanged: no line
        clock.now = 1_060.0
        writer.update(2, 8, {"loss": 0.5})
        assert watch.poll() == "step 2/8 (25%), ETA 3 min, loss 0.5"
        clock.now += 1
        writer.update(2, 8, {"loss": 0.4})  # a metric alone, read at once: the job ended
        assert watch.poll(final=True) == "step 2/8 (25%), ETA 3 min, loss 0.4"
        store.write_bytes(progress_key("job1"), b"{torn")
        assert watch.poll(final=True) is None and watch.last.metrics == {"loss": 0.4}
    finally:
        metrics.install(None)
    assert sink.sent == [("kinetic.job.progress", 0.0), ("kinetic.job.progress", 25.0)] + [
        ("kinetic.job.progress", 25.0)
    ]


def test_a_batch_line_counts_children_and_names_each_running_childs_step(tmp_path):
    from airflow_provider_kinetic.core.batch.progress import BatchProgress
    from tests.fixtures import records

    store = LocalStore(str(tmp_path))
    state = records.batch_state(6, {0: "job-c0", 1: "job-c1"}, root=str(tmp_path))
    for job_id, step in (("job-c0", 3), ("job-c1", None)):
        (tmp_path / job_id).mkdir()
        if step is not None:
            Reporter(store, progress_key(job_id), clock=Clock()).update(step, 10, {"loss": 1})
    clock = Clock(0.0)
    watch = BatchProgress(clock)
    assert watch.line(state, store) == "0/6 children done (0%); child 0 step 3/10 (30%)"
    clock.now = 120.0  # two children ended in two minutes: four more take four
    state.done.update({4: "SUCCEEDED", 5: "FAILED"})
    assert watch.line(state, store) == (
        "2/6 children done (33%), ETA 4 min; child 0 step 3/10 (30%)"
    )
    state.done.update(dict.fromkeys(range(4), "SUCCEEDED"))
    state.active.clear()
    assert watch.line(state, store) == "6/6 children done (100%)"


def test_a_batch_seen_from_outside_gets_its_eta_from_finished_children(tmp_path) -> None:
    """The Kinetic tab has no process that watched the batch: the ETA is the rate of
    children finished since it was submitted; none finished (or all): no ETA."""
    from airflow_provider_kinetic.core.batch.progress import summary
    from airflow_provider_kinetic.core.storage import LocalStore

    store = LocalStore(str(tmp_path))
    seen = summary(store, total=6, done=2, running={2: "job-none"}, elapsed_s=240.0)
    assert seen.eta_s == 480.0  # 4 left at 2 per 240 s
    assert seen.describe() == "2/6 children done (33%), ETA 8 min"  # job-none: no report
    assert seen.to_json()["fraction"] == 2 / 6
    assert summary(store, 6, 0, {}, 240.0).eta_s is None
    assert summary(store, 6, 6, {}, 240.0).describe() == "6/6 children done (100%)"
    assert summary(store, 6, 2, {}, None).eta_s is None  # no submission time known
