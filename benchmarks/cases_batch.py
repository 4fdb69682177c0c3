"""Batch case: N trivial inputs on the local backend through the real batch code path
(``plan_batch`` -> ``start_batch`` -> ``launch``/``observe`` until finished).

There is no kinetic baseline to run (kinetic has no local backend); the row reports
the wall time and checks the write budget: at most N + 10 objects written, and the
function, context and inputs blob written once (kinetic writes a payload and a
context per child).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from table import Row

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.storage import LocalStore

EXTRA_WRITES = 10


class CountingStore(LocalStore):
    """Records every object written (every write lands through ``_commit``)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.writes: list[str] = []

    def _commit(self, key, fill, **kwargs):  # type: ignore[no-untyped-def]
        self.writes.append(key)
        return super()._commit(key, fill, **kwargs)


def add_one(x: int) -> int:
    return x + 1


def batch(root: Path, n: int, max_concurrent: int = 16, timeout_s: float = 1800.0) -> Row:
    store = CountingStore(str(root / "store"))
    config = KineticConfig(backend="local", root=store.bucket)
    backend = LocalBackend(store.bucket)
    start = time.perf_counter()
    state, objects, local = plan_batch(
        JobRequest(func=add_one, output_dir=store.uri("outputs/bench")),
        list(range(n)),
        "single",
        store,
        config=config,
        max_concurrent=max_concurrent,
        retries=0,
        fail_fast=False,
    )
    batchlaunch.start_batch(state, objects, local, store)
    deadline = time.monotonic() + timeout_s
    while True:
        batchlaunch.launch(state, config, backend, store)
        batchmanifest.maybe_write_manifest(state, store)
        if batchrun.is_finished(state):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch did not finish: {batchrun.counts(state)}")
        time.sleep(0.02)  # the poll interval of this driver loop
        reports = backend.batch_status(state.group_id, list(state.active.values()))
        batchrun.observe(state, reports, backend, store)
    wall = time.perf_counter() - start
    values, failures = batchoutcomes.gather(state, store)
    writes = Counter(store.writes)
    # The batch's shared objects are the ones the plan made (function, context, inputs;
    # a requirements file where an image is prebuilt), whatever their keys.
    shared = sorted(objects)
    ok_values = not failures and values == [i + 1 for i in range(n)]
    once = len(shared) >= 3 and all(writes[k] == 1 for k in shared)
    within = len(store.writes) <= n + EXTRA_WRITES
    return Row(
        f"batch of {n:,} trivial inputs, local, max_concurrent {max_concurrent}",
        "-",
        f"{wall:.1f} s",
        None,
        f"writes <= N+{EXTRA_WRITES}, shared objects once",
        ok_values and once and within,
        f"{len(store.writes)} writes for N={n} ({len(shared)} shared objects, each "
        f"written {sorted(set(writes[k] for k in shared))} time(s)); "
        f"{n / wall:.1f} inputs/s; results {'correct' if ok_values else 'WRONG'}",
    )
