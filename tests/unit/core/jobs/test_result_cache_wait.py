"""``core.jobs.resultcache``: the claim of concurrent identical tasks and the wait for
its result, on a real local store with a controllable clock (no sleeping)."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_kinetic.core.jobs import history, resultcache
from airflow_provider_kinetic.core.storage import LocalStore

OWNER = {"dag_id": "d", "run_id": "r1", "task_id": "t", "map_index": -1}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def store(tmp_path: Path) -> LocalStore:
    return LocalStore(str(tmp_path / "kinetic"))


def entry(key: str, job_id: str) -> resultcache.CacheEntry:
    return resultcache.CacheEntry(key, job_id, {}, None, history.now_iso(), producer=OWNER)


def test_one_claim_at_a_time(tmp_path):
    s = store(tmp_path)
    assert resultcache.claim(s, "k", OWNER) and not resultcache.claim(s, "k", {"other": 1})
    resultcache.release(s, "k", {"other": 1})  # not its claim: kept
    assert resultcache.read_claim(s, "k").owner == OWNER
    resultcache.release(s, "k", OWNER)
    assert resultcache.read_claim(s, "k") is None


def test_the_wait_ends_with_the_entry_or_says_why(tmp_path):
    s, clock = store(tmp_path), Clock()
    resultcache.claim(s, "k", OWNER)
    resultcache.claim_job(s, "k", OWNER, "job-1")

    def deliver(seconds: float) -> None:  # the winner delivers while the loser waits
        clock.sleep(seconds)
        s.write_bytes("job-1/result.pkl", b"x")
        resultcache.record(s, entry("k", "job-1"))

    got = resultcache.wait_for(s, "k", timeout_s=60, sleep=deliver, clock=clock)
    assert got.entry is not None and got.entry.job_id == "job-1"

    resultcache.remove(s, "k")
    history.submitted(
        s, "job-1", OWNER, backend="local", accelerator="cpu", func="f", output_dir=None
    )
    history.update(s, "job-1", "FAILED", "boom")  # never a failed result: run your own
    got = resultcache.wait_for(s, "k", timeout_s=60, sleep=clock.sleep, clock=clock)
    assert got.entry is None and "ended FAILED" in got.why

    resultcache.release(s, "k")
    got = resultcache.wait_for(s, "k", timeout_s=60, sleep=clock.sleep, clock=clock)
    assert got.entry is None and "without a result" in got.why


def test_a_claim_whose_job_ended_uncollected_or_that_never_named_one_is_stale(tmp_path):
    s, clock = store(tmp_path), Clock()
    resultcache.claim(s, "k", OWNER, now=clock())
    resultcache.claim_job(s, "k", OWNER, "job-2")  # its history says nothing ended
    asked = []

    def ended(job_id: str) -> bool:
        asked.append(job_id)
        return True

    got = resultcache.wait_for(
        s, "k", timeout_s=3600, poll_s=5, sleep=clock.sleep, clock=clock, job_ended=ended
    )
    assert got.entry is None and "no task collected it" in got.why and len(asked) == 2
    got = resultcache.wait_for(s, "k", timeout_s=10, poll_s=5, sleep=clock.sleep, clock=clock)
    assert "no result within 10 s" in got.why

    resultcache.release(s, "k")
    resultcache.claim(s, "k", OWNER, now=clock())
    held = resultcache.read_claim(s, "k")
    assert resultcache.stale(s, held, clock()) is None
    assert "no job" in resultcache.stale(s, held, clock() + resultcache.CLAIM_GRACE_S)
