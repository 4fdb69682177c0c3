"""Batch core without Airflow: write counts, shared payload, bad options."""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import PAYLOAD_CACHE, plan_batch
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.batch_drive import drive


class CountingStore(LocalStore):
    """A LocalStore that records every object it writes (one entry per object)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.writes: list[str] = []

    def _commit(self, key, fill, **kwargs):  # every object written lands through here
        self.writes.append(key)
        return super()._commit(key, fill, **kwargs)


def scale(x: int, factor: int, table: str) -> int:
    import os

    return x * factor + len(os.listdir(table))


def _run(state, config, backend, store, timeout=240.0):
    """Drive the batch as its sensor would (kinetic's manifest kept current)."""
    drive(state, config, backend, store, timeout=timeout, manifest=True)


@pytest.mark.parametrize("n", [60])
def test_batch_writes_at_most_n_plus_c_and_function_once(tmp_path, n):
    table = tmp_path / "table"
    table.mkdir()
    for i in range(3):
        (table / f"t{i}").write_text(str(i))
    store = CountingStore(str(tmp_path / "store"))
    config = KineticConfig(backend="local", root=store.bucket)
    backend = LocalBackend(store.bucket)
    request = JobRequest(
        func=scale,
        kwargs={"factor": 10, "table": Data(str(table))},
        output_dir=store.uri("outputs/batch"),
    )
    state, objects, local = plan_batch(
        request,
        list(range(n)),
        "single",
        store,
        config=config,
        max_concurrent=8,
        retries=0,
        fail_fast=False,
    )
    assert store.writes == []  # planning uploads nothing
    batchlaunch.start_batch(state, objects, local, store)
    _run(state, config, backend, store)
    values, failures = batchoutcomes.gather(state, store)
    assert failures == {} and values == [i * 10 + 3 for i in range(n)]
    writes = Counter(store.writes)
    payloads = [k for k in writes if k.startswith(PAYLOAD_CACHE) and k.endswith(".pkl")]
    assert len(payloads) == 1 and writes[payloads[0]] == 1  # the function, once
    handles = [k for k in writes if k.endswith("/handle.json")]
    assert len(handles) == n
    data_files = [k for k in writes if k.startswith("default/data-")]
    # The shared Data, once: its 3 file objects, its manifest, the upload's claim and
    # the marker (the incremental layout).
    assert len(data_files) == 3 + 3 and all(n == 1 for k, n in writes.items() if k in data_files)
    c = len(store.writes) - n
    assert c <= 12, writes  # payload, context, inputs, data, a few manifest rewrites
    # A second batch with the same Data hits the data cache: it uploads no data again.
    store.writes.clear()
    state2, objects2, local2 = plan_batch(
        request,
        [1, 2],
        "single",
        store,
        config=config,
        max_concurrent=2,
        retries=0,
        fail_fast=False,
    )
    batchlaunch.start_batch(state2, objects2, local2, store)
    assert not [k for k in store.writes if k.startswith("default/data")]
    assert len([k for k in store.writes if k.startswith(PAYLOAD_CACHE)]) == 1  # its payload


@pytest.mark.parametrize(
    ("inputs", "mode", "max_concurrent", "retries", "match"),
    [
        ([], "auto", 4, 0, "inputs is empty"),
        ([1, 2], "auto", 0, 0, "max_concurrent must be an integer >= 1, got 0"),
        ([1, 2], "auto", 2, -1, "retries must be an integer >= 0, got -1"),
        (
            [[1], 7],
            "args",
            2,
            0,
            r"input_mode='args' needs a list or tuple per input; "
            r"inputs\[1\] is int: 7",
        ),
        ([{"a": 1}, 3], "kwargs", 2, 0, r"inputs\[1\] is int"),
        ([1], "spread", 2, 0, "input_mode 'spread' is not one of auto, single, args, kwargs"),
        ("abc", "auto", 2, 0, "inputs must be a list or tuple"),
    ],
)
def test_bad_batch_options_fail_before_anything_is_written(
    tmp_path, inputs, mode, max_concurrent, retries, match
):
    store = CountingStore(str(tmp_path / "store"))
    config = KineticConfig(backend="local", root=store.bucket)
    with pytest.raises((ValueError, TypeError), match=match):
        plan_batch(
            JobRequest(func=scale),
            inputs,
            mode,
            store,
            config=config,
            max_concurrent=max_concurrent,
            retries=retries,
            fail_fast=False,
        )
    assert store.writes == [] and not [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def test_input_modes_auto(tmp_path):
    from airflow_provider_kinetic.core.batch.plan import split_input

    assert split_input({"a": 1, "b": 2}, "auto", 0) == ((), {"a": 1, "b": 2})
    assert split_input({"class": 1}, "auto", 0) == (({"class": 1},), {})
    assert split_input({1: "x"}, "auto", 0) == (({1: "x"},), {})
    assert split_input([1, 2], "auto", 0) == ((1, 2), {})
    assert split_input("s", "auto", 0) == (("s",), {})
    assert split_input([1, 2], "single", 0) == (([1, 2],), {})


def exit_without_payload(x: int) -> int:
    import os

    if x == 1:
        os._exit(7)  # the runner's process ends before it can write any payload
    return x


def test_a_child_that_died_without_a_payload_says_why(tmp_path, caplog):
    """A child whose process ended without an error payload fails with the reason its
    backend gave (here the exit code), in gather's error and in the log, and the
    reason survives the state's wire form (a resumed or re-driven batch keeps it)."""
    store = LocalStore(str(tmp_path / "store"))
    config = KineticConfig(backend="local", root=store.bucket)
    request = JobRequest(func=exit_without_payload, output_dir=store.uri("outputs/died"))
    state, objects, local = plan_batch(
        request, [0, 1], "single", store, config=config,
        max_concurrent=2, retries=0, fail_fast=False,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    with caplog.at_level("WARNING", logger=batchrun.log.name):
        _run(state, config, LocalBackend(store.bucket), store)
    assert f"inputs[1] ({state.jobs[1]}) failed (exit code 7)" in caplog.text
    again = type(state).from_dict(state.to_dict())
    assert again.failed_why == {1: "exit code 7"}
    values, failures = batchoutcomes.gather(again, store)
    assert values[0] == 0 and list(failures) == [1]
    assert f"job {state.jobs[1]} failed (exit code 7); no result payload" in str(failures[1])
