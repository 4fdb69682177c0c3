"""Usage accounting (``core.jobs.usage``) from history entries and start records with
known times: exact chip-hours, queued time split at admission, preemptions, batches,
what is frozen into the history before the cleanup, and the task log's line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.jobs import history, usage
from airflow_provider_kinetic.core.jobs.checkpoint import started_key, started_record
from airflow_provider_kinetic.core.jobs.finish import host_count
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore

T0 = 1_790_000_000.0  # a whole second: entries keep ISO seconds
IDENTITY = {"dag_id": "d", "task_id": "train", "run_id": "r1", "map_index": -1, "try_number": 1}


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(str(tmp_path / "store"))


def put(store: LocalStore, key: str, at: float, data: bytes = b"x") -> None:
    """An object written at ``at`` (its modification time, as a listing reports it)."""
    store.write_bytes(key, data)
    path = Path(store.bucket, *key.split("/"))
    os.utime(path, (at, at))


def job(
    store: LocalStore,
    job_id: str,
    *,
    accel: str = "tpu-v6e-8",
    submitted: float = T0,
    started: float | None = None,
    result_at: float | None = None,
    state: str | None = None,
    ended: float | None = None,
    **extra: Any,
) -> None:
    """A job as the provider leaves it: entry at submit, ``handle.json``, the runner's
    start record and result, and how the waiting side saw it end."""
    at = history.now_iso(submitted)
    history.submitted(store, job_id, IDENTITY, backend="gke", accelerator=accel, func="f",
                      output_dir=None, submitted_at=at, **extra)  # fmt: skip
    put(store, f"{job_id}/handle.json", submitted)
    if started is not None:
        put(store, started_key(f"{job_id}/"), started, started_record(started, 0, 1))
    if result_at is not None:
        put(store, f"{job_id}/result.pkl", result_at)
        put(store, f"{job_id}/result.pkl.sig", result_at)
    if state is not None:
        fields = {"ended_at": history.now_iso(ended)} if ended is not None else {}
        history.update(store, job_id, state, **fields)


def test_two_attempts_spot_preempted_then_on_demand(store):
    # Attempt 1 on spot: queued 60 s, ran 1800 s, preempted (no result: the entry's end).
    job(store, "job-a1", accel="tpu-v6e-8:spot", started=T0 + 60, state="PREEMPTED",
        ended=T0 + 1860)  # fmt: skip
    # Attempt 2 on demand: queued 600 s, ran 3600 s until its result.
    t1 = T0 + 2000
    job(store, "job-a2", submitted=t1, started=t1 + 600, result_at=t1 + 4200, state="SUCCEEDED",
        ended=t1 + 4230, capacity="on-demand")  # fmt: skip
    got = usage.for_jobs(store, ["job-a2", "job-a1"], record=False)
    assert [a["job_id"] for a in got["attempts_detail"]] == ["job-a1", "job-a2"]  # oldest first
    first, second = got["attempts_detail"]
    hosts = parse_accelerator("tpu-v6e-8").num_nodes  # the catalog's
    assert (first["capacity"], first["chips"], first["hosts"]) == ("spot", 8, hosts)
    assert (first["queued_s"], first["run_s"], first["chip_hours"]) == (60.0, 1800.0, 4.0)
    assert first["preempted"] is True and first["ended_at"] == history.now_iso(T0 + 1860)
    # The runner's result, not the poll that saw the end 30 s later.
    assert (second["queued_s"], second["run_s"], second["chip_hours"]) == (600.0, 3600.0, 8.0)
    assert second["started_at"] == history.now_iso(t1 + 600)
    assert got["chip_hours"] == 12.0 and got["run_s"] == 5400.0 and got["queued_s"] == 660.0
    assert (got["attempts"], got["jobs"], got["preemptions"]) == (2, 2, 1)
    assert (got["accelerator"], got["capacity"]) == ("tpu-v6e-8", "on-demand")  # the last
    assert got["capacities"] == {
        "spot": {"attempts": 1, "chip_hours": 4.0, "run_s": 1800.0},
        "on-demand": {"attempts": 1, "chip_hours": 8.0, "run_s": 3600.0},
    }
    assert "cost" not in got and "unpriced_chip_hours" not in got  # no table: no cost
    assert "cost" not in json.dumps(got)
    assert usage.summary_line(got) == (
        "tpu-v6e-8 on on-demand: 12.0 chip-hours (4.0 on spot, 8.0 on on-demand) over "
        "2 attempts, 11 min queued, 1 preemption"
    )
    table = {"tpu-v6e": {"spot": 1.25, "*": 2.5}}
    priced = usage.for_jobs(store, ["job-a1", "job-a2"], table, record=False)
    assert priced["cost"] == 4.0 * 1.25 + 8.0 * 2.5 and priced["unpriced_chip_hours"] == 0
    assert [a["cost"] for a in priced["attempts_detail"]] == [5.0, 20.0]
    assert usage.summary_line(priced).endswith(", 1 preemption, est. $25.00")


def test_queued_time_splits_at_admission_and_the_first_admission_stays(store):
    job(store, "job-k", started=T0 + 160, result_at=T0 + 160 + 900, state="SUCCEEDED")
    usage.note_admitted(store, "job-k", T0 + 100)
    usage.note_admitted(store, "job-k", T0 + 150)  # evicted and admitted again: kept first
    usage.note_admitted(store, "job-none", T0)  # no entry (a batch child): nothing made
    assert history.read(store, "job-none") is None
    got = usage.job_usage(store, history.read(store, "job-k"))
    assert got["admitted_at"] == history.now_iso(T0 + 100)
    assert (got["queued_s"], got["admission_wait_s"], got["start_wait_s"]) == (160.0, 100.0, 60.0)
    assert got["chip_hours"] == 8 * 900 / 3600


def test_usage_frozen_before_cleanup_survives_it(store):
    job(store, "job-f", accel="tpu-v6e-16", started=T0 + 30, result_at=T0 + 30 + 7200,
        state="SUCCEEDED")  # fmt: skip
    assert usage.record_usage(store, "job-f") is not None
    assert store.delete_prefix("job-f/") > 0  # the policy deletes the start record and result
    entry = history.read(store, "job-f")
    assert entry["usage"]["chip_hours"] == 16 * 2.0
    assert entry["usage"]["hosts"] == parse_accelerator("tpu-v6e-16").num_nodes > 1
    got = usage.job_usage(store, entry)
    assert (got["run_s"], got["chip_hours"], got["queued_s"]) == (7200.0, 32.0, 30.0)
    assert got["dag_id"] == "d" and got["state"] == "SUCCEEDED"
    # for_jobs records on the way; a job not ended yet is not frozen.
    job(store, "job-g", started=T0 + 10, state="RUNNING")
    got = usage.for_jobs(store, ["job-g"], now=T0 + 610)
    assert "usage" not in history.read(store, "job-g")
    assert got["running"] == 1 and got["run_s"] == 600.0 and got["chip_hours"] == 8 * 600 / 3600
    assert usage.summary_line(got).endswith(", 1 still running")


def test_unrecorded_start_is_unmeasured_and_a_job_that_never_started_held_nothing(store):
    # Succeeded, artifacts gone before anyone recorded its usage, nobody saw it RUNNING.
    job(store, "job-u", state="SUCCEEDED", ended=T0 + 500)
    store.delete_prefix("job-u/")
    # Cancelled while pending: artifacts there, no start record, no result.
    job(store, "job-c", submitted=T0 + 1000, state="CANCELLED", ended=T0 + 1300)
    got = usage.for_jobs(store, ["job-u", "job-c", "job-gone"], record=False)
    unmeasured, cancelled = got["attempts_detail"]
    assert unmeasured["run_s"] is None and unmeasured["chip_hours"] is None
    assert (cancelled["run_s"], cancelled["chip_hours"], cancelled["queued_s"]) == (0.0, 0.0, 300.0)
    assert got["unmeasured_jobs"] == 1 and got["missing"] == ["job-gone"]
    assert got["chip_hours"] == 0.0
    assert usage.summary_line(got) == (
        "tpu-v6e-8 on on-demand: 0 chip-hours over 2 attempts, 5 min queued, "
        "1 without a recorded run time"
    )


def test_cpu_jobs_count_hours_not_chips(store):
    job(store, "job-cpu", accel="cpu", started=T0 + 30, result_at=T0 + 30 + 1800,
        state="SUCCEEDED")  # fmt: skip
    got = usage.for_jobs(store, ["job-cpu"], {"tpu-v6e": {"*": 1.0}}, record=False)
    assert (got["family"], got["attempts_detail"][0]["chips"], got["chip_hours"]) == (None, 0, 0.0)
    assert got["cost"] == 0.0 and got["unpriced_chip_hours"] == 0.0
    assert usage.summary_line(got) == (
        "cpu on on-demand: 0.5 hours over 1 attempt, 30 s queued, est. $0.00"
    )


def test_a_batch_sums_its_children_from_their_start_records_and_results(store):
    children = ["job-c1", "job-c2", "job-c3"]
    history.submitted(store, "grp-1", IDENTITY, backend="gke", accelerator="tpu-v5e-4",
                      func="f", output_dir=None, submitted_at=history.now_iso(T0),
                      kind="batch", total=2)  # fmt: skip
    put(store, "job-c1/handle.json", T0)
    put(store, "job-c1/started.json", T0 + 10)
    put(store, "job-c1/result.pkl", T0 + 910)
    put(store, "job-c2/handle.json", T0 + 5)
    put(store, "job-c2/started.json", T0 + 65)
    put(store, "job-c2/result.pkl", T0 + 1865)
    put(store, "job-c3/handle.json", T0 + 2000)  # preempted: started, no result
    put(store, "job-c3/started.json", T0 + 2020)
    history.update(store, "grp-1", "SUCCEEDED", child_jobs=children, preemptions=1)
    got = usage.job_usage(store, history.read(store, "grp-1"))
    assert (got["kind"], got["chips"], got["jobs"], got["measured_jobs"]) == ("batch", 4, 3, 2)
    assert got["run_s"] == 900.0 + 1800.0 and got["chip_hours"] == 3.0
    assert got["queued_s"] == 10.0 + 60.0 + 20.0
    assert got["started_at"] == history.now_iso(T0 + 10)
    assert got["ended_at"] == history.now_iso(T0 + 1865)
    assert (got["preemptions"], got["preempted"]) == (1, True)
    summed = usage.total([got])
    assert usage.summary_line(summed) == (
        "tpu-v5litepod-4 on on-demand: 3.0 chip-hours over 1 attempt (3 jobs), 2 min queued, "
        "1 preemption, 1 without a recorded run time"
    )
    # Frozen before the cleanup deletes the children's dirs, the same afterwards.
    usage.record_usage(store, "grp-1")
    for child in children:
        store.delete_prefix(f"{child}/")
    assert usage.job_usage(store, history.read(store, "grp-1"))["chip_hours"] == 3.0


def test_entry_alone_reads_nothing_else(store):
    job(store, "job-e", started=T0 + 5, result_at=T0 + 3605, state="SUCCEEDED", ended=T0 + 3700)
    entry = history.read(store, "job-e")
    entry["started_at"] = history.now_iso(T0 + 20)  # a waiting task saw RUNNING later
    got = usage.job_usage(store, entry, live=False)
    # No listing: the entry's own start and end (the poll times), 3680 s.
    assert (got["run_s"], got["queued_s"]) == (3680.0, 20.0)


def test_capacity_defaults_and_price_lookup_order():
    assert usage.capacity_of({"accelerator": "tpu-v6e-8:spot"}) == "spot"
    assert usage.capacity_of({"accelerator": "tpu-v6e-8"}) == "on-demand"
    assert usage.capacity_of({"accelerator": "tpu-v6e-8", "capacity": "flex-start"}) == "flex-start"
    table = {"tpu-v6e": {"reservation:r1": 1.0, "reservation": 2.0, "*": 3.0}}
    assert usage.price_for(table, "tpu-v6e", "reservation:r1") == 1.0
    assert usage.price_for(table, "tpu-v6e", "reservation:r2") == 2.0
    assert usage.price_for(table, "tpu-v6e", "spot") == 3.0
    assert usage.price_for(table, "gpu-h100", "spot") is None
    assert usage.accelerator_facts("gpu-h100x8") == {
        "accelerator": "gpu-h100x8", "family": "gpu-h100", "chips": 8, "hosts": 1,
    }  # fmt: skip
    assert usage.accelerator_facts("tpu-nope-3")["chips"] is None


def test_unpriced_chip_hours_are_named_not_priced(store):
    job(store, "job-h", accel="gpu-h100x8", started=T0, result_at=T0 + 900, state="SUCCEEDED")
    got = usage.for_jobs(store, ["job-h"], {"tpu-v6e": {"*": 1.0}}, record=False)
    assert got["cost"] == 0.0 and got["unpriced_chip_hours"] == 2.0
    assert got["attempts_detail"][0]["cost"] is None
    line = usage.summary_line(got)
    assert line.endswith("est. $0.00 + 2.0 chip-hours not in the price table"), line
    assert json.loads(json.dumps(got, allow_nan=False)) == got  # an XCom: plain JSON


def test_small_amounts_read_as_numbers_never_scientific_notation():
    from airflow_provider_kinetic.core.jobs.usage import summary_line

    base = {"accelerator": "gpu-l4x1", "capacity": "spot", "family": "gpu-l4", "attempts": 1}
    assert summary_line({**base, "chip_hours": 0.0014}).startswith(
        "gpu-l4x1 on spot: 0.0014 chip-hours over 1 attempt"
    )
    assert "<0.0001 chip-hours" in summary_line({**base, "chip_hours": 4.3e-05})
    assert "1.9 chip-hours" in summary_line({**base, "chip_hours": 1.94})


def test_a_multi_slice_job_counts_every_slices_chips(store):
    """4 slices of tpu-v5p-2x2x4 (16 chips, 4 hosts each): 64 chips on 16 hosts; the
    entry says so from the handle (``num_slices``), one slice's entry as before."""
    handle = JobHandle("job-ms", "jobset", str(store.bucket), accelerator="tpu-v5p-2x2x4",
                       created_at=history.now_iso(T0), num_slices=4)  # fmt: skip
    assert JobHandle.from_dict(handle.to_dict()).num_slices == 4
    assert "num_slices" not in JobHandle("j", "gke", "b").to_dict()
    history.job_submitted(store, handle, IDENTITY)
    put(store, "job-ms/handle.json", T0)
    put(store, started_key("job-ms/"), T0 + 60, started_record(T0 + 60, 0, 1))
    put(store, "job-ms/result.pkl", T0 + 60 + 1800)
    history.update(store, "job-ms", "SUCCEEDED")
    got = usage.for_jobs(store, ["job-ms"], {}, record=False)
    detail = got["attempts_detail"][0]
    assert (detail["chips"], detail["hosts"], got["chip_hours"]) == (64, 16, 32.0)
    assert host_count(handle) == 16 and host_count(handle.evolve(num_slices=None)) == 4
