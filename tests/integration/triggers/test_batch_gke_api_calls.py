"""A driven batch's API calls per poll do not grow with the batch (GKE, the API double).

The real ``KineticBatchTrigger`` (``drive=True``, as the map operator defers) drives a
small and a larger batch against the Kubernetes API double, its "kubelet" finishing
each child Job as it appears (the result written as the runner would).  Polls are
told apart by the trigger's status query (one Job list per poll); between two of
them, the reads (every GET: lists, single reads, logs) must stay the same however
many inputs the batch has, and the writes follow only the children that were
created or ended in that poll (bounded by ``max_concurrent``).

The kubelet and the trigger keep in step (``in_step``): each status query waits until
the kubelet has finished every child created before it, so every poll finds its wave
ended and the number of polls is the number of waves, not what the machine's load
makes of a 0.05 s poll interval (a poll that finds nothing to do reads all the same,
so counts over the whole batch would follow the load).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
from tests.fixtures.k8s_double import ThreadedDouble, by_code_under_test
from tests.fixtures.waiting import wait_for_async
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures
    JOBS,
    connections,
    google_token,
)
from tests.integration.operators.test_sweep_gke_scale import ResultKubelet

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously

MAX_CONCURRENT = 4
SMALL, LARGE = 8, 48


def twice(i: int) -> int:
    return 2 * i


class CountingKubelet(ResultKubelet):
    """:class:`ResultKubelet` that counts the child Jobs it has finished."""

    def __init__(self, double: ThreadedDouble, total: int, after: int) -> None:
        super().__init__(double, total, after)
        self.finished = 0

    def finish(self, job: dict[str, Any]) -> None:
        super().finish(job)
        self.finished += 1


def in_step(backend: Any, double: ThreadedDouble, kubelet: CountingKubelet) -> None:
    """Make each of ``backend``'s batch status queries wait until ``kubelet`` has
    finished every child Job created so far."""
    query = backend.abatch_status

    async def after_the_kubelet(*args: Any, **kwargs: Any) -> Any:
        def finished() -> bool:
            assert kubelet.error is None, kubelet.error
            return kubelet.finished >= len(double.sent("POST", JOBS))

        await wait_for_async("the kubelet to finish the children", finished)
        return await query(*args, **kwargs)

    backend.abatch_status = after_the_kubelet


async def _events(trigger: KineticBatchTrigger) -> list[Any]:
    return [event async for event in trigger.run()]


def _drive(
    double: ThreadedDouble, n: int
) -> tuple[BatchState, list[dict[str, int]], dict[str, int]]:
    """Plan ``n`` inputs, launch the first children as the operator does, let the
    trigger drive the rest; the final state, the requests of each poll and those of
    the whole batch (the first launch included)."""
    hook = KineticHook("kinetic_gke")
    config, store, secret = hook.get_config(), hook.get_store(), deployment_secret()
    state, objects, local = plan_batch(
        JobRequest(func=twice, output_dir=store.uri(f"outputs/calls-{uuid.uuid4().hex}")),
        list(range(n)), "single", store, config=config, max_concurrent=MAX_CONCURRENT,
        retries=0, fail_fast=False, signing_secret=secret,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    backend = hook.get_backend(state.backend)
    start = len(double.requests())
    kubelet = CountingKubelet(double, n, start)
    kubelet.start()
    try:
        batchlaunch.launch(state, config, backend, store, secret)
        state.driver = uuid.uuid4().hex
        trigger = KineticBatchTrigger(
            state=state.to_dict(), config=config_to_json(config), poll_interval=0.05,
            log_bytes_per_poll=0, drive=True,
        )  # fmt: skip
        in_step(backend, double, kubelet)
        trigger._backend = lambda: backend  # type: ignore[method-assign] - the one in step
        (event,) = asyncio.run(_events(trigger))
    finally:
        kubelet.abort.set()
        kubelet.join(60)
    assert kubelet.error is None, kubelet.error
    assert event.payload["status"] == "finished", event.payload
    polls: list[dict[str, int]] = []
    total = {"GET": 0, "write": 0}
    for request in by_code_under_test(double.requests()[start:]):
        total["GET" if request.method == "GET" else "write"] += 1
        if request.method == "GET" and request.url.path == JOBS:
            polls.append({"GET": 0, "write": 0})  # the status query opens a poll
        if polls:
            polls[-1]["GET" if request.method == "GET" else "write"] += 1
    return BatchState.from_dict(event.payload["state"]), polls, total


def test_reads_per_poll_stay_flat_as_the_batch_grows(
    connections,  # noqa: F811 - the fixture
    api,
) -> None:
    results, totals = {}, {}
    for n in (SMALL, LARGE):
        state, polls, totals[n] = _drive(api, n)
        assert state.finished and state.done == {i: SUCCEEDED for i in range(n)}
        names = {job for job in state.jobs.values()}
        assert len(names) == n  # every input ran once
        results[n] = polls
        api.call(lambda d: d.forget_requests())
    small, large = results[SMALL], results[LARGE]
    # Six times the inputs: six times the polls (one per wave of max_concurrent
    # children), none of them reading more than the Job and pod lists, the namespace's
    # events and a single read per active child missing from the lists: a bound set by
    # max_concurrent, not by the batch.
    waves = {n: n // MAX_CONCURRENT for n in (SMALL, LARGE)}
    assert (len(small), len(large)) == (waves[SMALL], waves[LARGE]), (small, large)
    reads_bound = 3 + MAX_CONCURRENT
    assert max(p["GET"] for p in small + large) <= reads_bound, (small, large)
    # Writes per poll follow the children created and ended in it (a Secret, a Job,
    # its owner patch, its delete), never the batch.
    assert max(p["write"] for p in small + large) <= 4 * 2 * MAX_CONCURRENT, (small, large)
    # Per input, over the whole batch: the same within a margin at both sizes (the
    # polls are the waves: none finds nothing to do).
    per_input = {n: {kind: c / n for kind, c in totals[n].items()} for n in totals}
    for n, ps in results.items():  # shown with -s: the numbers behind the assertions
        print(f"{n} inputs: {len(ps)} polls, per input {per_input[n]}")
    calls = {n: c["GET"] + c["write"] for n, c in per_input.items()}
    assert calls[LARGE] <= 1.5 * calls[SMALL], per_input
    assert per_input[LARGE]["write"] <= 1.25 * per_input[SMALL]["write"], per_input
