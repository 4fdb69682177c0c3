"""The triggerer's log budget: bounded per window, least recently served first, shared fairly."""

from __future__ import annotations

from collections import Counter

from airflow_provider_kinetic.core.backends.log_budget import LogBudget

KB = 1024


def test_each_job_in_turn_none_twice_in_a_window_none_starves() -> None:
    budget = LogBudget(calls=3, max_bytes=1 << 30, window_s=5.0)
    jobs = [f"job-{i}" for i in range(10)]
    for job in jobs:
        budget.join(job)
    served: list[list[str]] = []
    for window in range(8):
        now = 5.0 * window
        got = budget.grant([(j, 64 * KB) for j in jobs], now)
        assert budget.grant([(j, 64 * KB) for j in jobs], now + 1) == {}  # spent: none twice
        served.append(list(got))
    assert all(len(s) == 3 for s in served)
    # Least recently served first: a round robin, in joining order.
    flat = [j for s in served for j in s]
    assert flat[:10] == jobs and flat[10:20] == jobs
    # Every job within ceil(10 / 3) = 4 windows of its last read.
    for job in jobs:
        windows = [w for w, s in enumerate(served) if job in s]
        assert windows and max(b - a for a, b in zip([-1, *windows], windows, strict=False)) <= 4


def test_bytes_are_bounded_and_a_cap_never_exceeds_what_is_left() -> None:
    budget = LogBudget(calls=10, max_bytes=100 * KB, window_s=5.0)
    for job in "abcd":
        budget.join(job)
    got = budget.grant([(j, 40 * KB) for j in "abcd"], 0.0)
    assert got == {"a": 40 * KB, "b": 40 * KB, "c": 20 * KB}
    assert budget.grant([("d", 40 * KB)], 4.9) == {}  # the window is spent
    assert budget.grant([(j, 40 * KB) for j in "abcd"], 5.0) == {"d": 40 * KB, "a": 40 * KB,
                                                                    "b": 20 * KB}  # fmt: skip


def test_a_finished_jobs_drain_is_paid_by_the_window() -> None:
    budget = LogBudget(calls=4, max_bytes=1 << 30, window_s=5.0)
    for job in "abcd":
        budget.join(job)
    budget.spend(3, 10 * KB, 0.0)  # a drain before the live reads of this window
    assert list(budget.grant([(j, KB) for j in "abcd"], 0.1)) == ["a"]
    assert len(budget.grant([(j, KB) for j in "abcd"], 5.0)) == 4  # the next window is whole


def test_two_readers_share_the_budget_by_their_number_of_jobs() -> None:
    """The namespace listed first in a window cannot take every read: each reader
    gets its jobs' share, so the other namespace's jobs are read too."""
    budget = LogBudget(calls=4, max_bytes=1 << 30, window_s=5.0)
    first, second = [f"a{i}" for i in range(6)], [f"b{i}" for i in range(2)]
    for job in first + second:
        budget.join(job)
    counts: Counter[str] = Counter()
    for window in range(6):
        now = 5.0 * window
        counts.update(budget.grant([(j, KB) for j in first], now))  # ticks first, always
        counts.update(budget.grant([(j, KB) for j in second], now + 0.5))
    assert all(counts[j] >= 2 for j in first + second), counts
    assert counts["b0"] + counts["b1"] >= 6  # its share: 4 * 2/8 = 1 per window at least


def test_a_job_that_left_is_never_granted() -> None:
    budget = LogBudget(calls=4, window_s=5.0)
    budget.join("a")
    budget.join("b")
    budget.leave("a")
    assert budget.grant([("a", KB), ("b", KB), ("never-joined", KB)], 0.0) == {"b": KB}
