"""Which run adds a stable asset's event through an alias (operators/asset_links.py):
one linker at a time, named by compare-and-swap in a real local store; the others use
the alias only once the linker's success committed the link (issue 42: Airflow fails
one of two concurrent first events of an alias for one asset)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.operators.asset_links import Linker, decide, link_key

ALIAS, URI = "kinetic:etl/train", "x-kinetic-task://etl/train"


def run(n: int, map_index: int = -1) -> Linker:
    return Linker("etl", "train", f"scheduled__2026-10-{n:02d}", map_index)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(str(tmp_path))


def states(table: dict[Linker, str | None]):  # noqa: ANN201
    asked: list[Linker] = []

    def state_of(linker: Linker) -> str | None:
        asked.append(linker)
        return table.get(linker)

    state_of.asked = asked  # type: ignore[attr-defined]
    return state_of


def test_the_first_run_links_and_a_run_meeting_it_in_flight_does_not(store):
    first = decide(store, ALIAS, URI, run(1), states({}))
    assert first.via_alias and "first event" in first.reason
    # The linker is still running (or deferred, queued, up for retry): its event may be
    # in flight, so a second run must not add a first event of its own.
    for state in ("running", "deferred", "queued", "up_for_retry", "scheduled"):
        other = decide(store, ALIAS, URI, run(2), states({run(1): state}))
        assert not other.via_alias and state in other.reason, state


def test_a_later_try_of_the_linker_and_runs_after_its_success_use_the_alias(store):
    decide(store, ALIAS, URI, run(1), states({}))
    again = states({})
    assert decide(store, ALIAS, URI, run(1), again).via_alias  # its own later try
    assert again.asked == []  # no need to ask Airflow
    after = decide(store, ALIAS, URI, run(2), states({run(1): "success"}))
    assert after.via_alias and "linked by etl.train of run scheduled__2026-10-01" in after.reason
    # A mapped instance of the same run is another task instance.
    mapped = decide(store, ALIAS, URI, run(1, map_index=0), states({run(1): "running"}))
    assert not mapped.via_alias


@pytest.mark.parametrize("state", [None, "failed", "upstream_failed", "skipped", "removed"])
def test_a_linker_that_ended_without_success_is_replaced(store, state):
    decide(store, ALIAS, URI, run(1), states({}))
    taken = decide(store, ALIAS, URI, run(2), states({run(1): state}))
    assert taken.via_alias and "this run links it" in taken.reason
    # run 2 is the linker now: a third run meets it running.
    third = decide(store, ALIAS, URI, run(3), states({run(1): state, run(2): "running"}))
    assert not third.via_alias and "scheduled__2026-10-02" in third.reason


def test_an_unknown_state_counts_as_in_flight(store):
    decide(store, ALIAS, URI, run(1), states({}))

    def broken(linker: Linker) -> str | None:
        raise RuntimeError("execution API unreachable")

    decision = decide(store, ALIAS, URI, run(2), broken)
    assert not decision.via_alias and "unreachable" in decision.reason


def test_an_unreadable_record_is_a_void_claim(store):
    store.write_bytes(link_key(ALIAS, URI), b"{not json")
    assert decide(store, ALIAS, URI, run(1), states({})).via_alias


def test_pairs_are_independent(store):
    decide(store, ALIAS, URI, run(1), states({}))
    key_uri = "kinetic://models/churn"
    assert decide(store, ALIAS, key_uri, run(2), states({run(1): "running"})).via_alias
    assert link_key(ALIAS, URI) != link_key(ALIAS, key_uri)


def test_of_concurrent_first_runs_exactly_one_links(store):
    """Eight runs decide at once on a fresh pair, each seeing the others running: one
    names itself, seven fall back (the swap lets one writer win)."""
    runs = [run(n) for n in range(1, 9)]
    running = states(dict.fromkeys(runs, "running"))
    barrier = threading.Barrier(len(runs))
    decisions: dict[Linker, bool] = {}

    def go(me: Linker) -> None:
        barrier.wait()
        decisions[me] = decide(store, ALIAS, URI, me, running).via_alias

    threads = [threading.Thread(target=go, args=(me,)) for me in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(decisions.values()) == [False] * 7 + [True]


def test_a_run_waits_for_the_linker_in_flight_and_then_uses_the_alias(store):
    """Runs that end together: the second asks again while the linker finishes."""
    decide(store, ALIAS, URI, run(1), states({}))
    answers = iter(["running", "running", "success"])
    asked: list[Linker] = []

    def state_of(linker: Linker) -> str | None:
        asked.append(linker)
        return next(answers)

    decision = decide(store, ALIAS, URI, run(2), state_of, wait_s=600, poll_s=0.01)
    assert decision.via_alias and asked == [run(1)] * 3
