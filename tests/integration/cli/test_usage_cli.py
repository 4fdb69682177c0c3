"""``airflow kinetic usage`` (the CLI's ``main`` called in this process, as
``tests/fixtures/cli.py`` does it): over jobs the local backend really ran
(their runner's start records and results), and over history entries with known
times, summed per DAG, task, accelerator and capacity, with and without a price table."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history, usage
from airflow_provider_kinetic.core.jobs.checkpoint import read_started, started_key
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.cli import run_cli
from tests.fixtures.local_conn import cancel_jobs, set_local_conn
from tests.fixtures.waiting import ended, wait_for

CONN = "kn_usage"
DEADLINE_S = 120.0  # a job to its end, on a loaded machine
HEADER = "accelerator,capacity,usd_per_chip_hour\n"


def add(a: int, b: int) -> int:
    return a + b


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KineticConfig]:
    root = tmp_path / "kinetic"
    set_local_conn(monkeypatch, root, CONN)
    monkeypatch.delenv("AIRFLOW__KINETIC__PRICE_TABLE", raising=False)
    yield KineticConfig(backend="local", root=str(root))
    cancel_jobs(root, release=True)  # never leave a job process behind


def cli(
    *args: str, ok: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``usage ARGS`` with this module's connection (``env`` set for the call only)."""
    out = run_cli("usage", *args, "--conn-id", CONN, env=env)
    if ok:
        assert out.returncode == 0, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
    return out


def as_json(*args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(cli(*args, "-o", "json", env=env).stdout)


def run_job(config: KineticConfig, accel: str, identity: dict[str, Any]) -> JobHandle:
    """A real job on the local backend, to its end: recorded in its history as a
    waiting task records it, its state dir released."""
    backend = LocalBackend(config.bucket_name)
    request = JobRequest(
        func=add, args=(1, 2), options=JobOptions(accelerator=accel), identity=identity
    )
    handle, _ = submit_job(request, config, backend, config.store(), deployment_secret())
    report = wait_for(f"{handle.job_id} to end", lambda: ended(backend.status(handle)), DEADLINE_S)
    status = report.status
    assert status is JobStatus.SUCCEEDED
    history.update(config.store(), handle.job_id, status.value)  # as its waiting task does
    backend.release(handle)
    return handle


def test_real_local_jobs_from_their_start_records_and_results(config: KineticConfig):
    store = config.store()
    ids = {"dag_id": "dag_u", "run_id": "r1", "map_index": -1, "try_number": 1}
    tpu = run_job(config, "tpu-v6e-8", {**ids, "task_id": "train"})
    cpu = run_job(config, "cpu", {**ids, "task_id": "prep"})
    # What the runner recorded: its start (content) and the result's write time.
    start = read_started(store, f"{tpu.job_id}/")["started_at"]
    end = os.stat(Path(store.bucket, tpu.job_id, "result.pkl.sig")).st_mtime
    run_s = round(end - start, 3)
    assert 0 < run_s < DEADLINE_S  # read from the right records: a span within the wait

    by_task = {(g["dag_id"], g["task_id"]): g for g in as_json("--by", "task")["groups"]}
    assert set(by_task) == {("dag_u", "train"), ("dag_u", "prep")}
    train = by_task["dag_u", "train"]
    assert (train["attempts"], train["jobs"], train["unmeasured_jobs"]) == (1, 1, 0)
    assert train["chip_hours"] == round(8 * run_s / 3600, 6) and train["run_s"] == run_s
    assert "cost" not in train  # no price table: no cost
    prep = by_task["dag_u", "prep"]
    assert prep["chip_hours"] == 0 and prep["unmeasured_jobs"] == 0 and prep["run_s"] > 0

    # Frozen into the history, then the policy deletes the artifacts: the same numbers.
    assert usage.record_usage(store, tpu.job_id)["run_s"] == run_s
    assert store.delete_prefix(f"{tpu.job_id}/") and not store.exists(started_key(tpu.job_id))
    again = {(g["dag_id"], g["task_id"]): g for g in as_json("--by", "task")["groups"]}
    assert again["dag_u", "train"] == train

    table = cli("--by", "accelerator").stdout.splitlines()
    assert table[0].split() == ["ACCELERATOR", "ATTEMPTS", "JOBS", "PREEMPTIONS", "CHIP_HOURS",
                                "RUN_HOURS", "QUEUED", "RUNNING", "UNMEASURED"]  # fmt: skip
    assert sorted(line.split()[0] for line in table[1:-1]) == ["cpu", "tpu-v6e-8"]
    assert table[-1].split()[:3] == ["(total)", "2", "2"]
    assert cpu.job_id != tpu.job_id


def entry(store: LocalStore, job_id: str, dag: str, task: str, accel: str, submitted: float,
          run_s: float, **extra: Any) -> None:  # fmt: skip
    """An ended job's history entry with its start record and result at known times."""
    identity = {"dag_id": dag, "task_id": task, "run_id": "r", "map_index": -1, "try_number": 1}
    at = history.now_iso(submitted)
    history.submitted(store, job_id, identity, backend="gke", accelerator=accel, func="f",
                      output_dir=None, submitted_at=at, **extra)  # fmt: skip
    start = submitted + 60
    store.write_bytes(started_key(f"{job_id}/"), json.dumps({"started_at": start}).encode())
    store.write_bytes(f"{job_id}/result.pkl", b"r")
    os.utime(Path(store.bucket, job_id, "result.pkl"), (start + run_s, start + run_s))
    history.update(store, job_id, "SUCCEEDED")


def test_groups_window_and_price_table(config: KineticConfig, tmp_path: Path):
    store = config.store()
    now = float(int(time.time()))
    day = 86400.0
    entry(store, "job-old", "etl", "t", "tpu-v6e-8", now - 10 * day, 3600)  # out of --since 7d
    entry(store, "job-s1", "train", "fit", "tpu-v6e-8:spot", now - 2 * day, 1800)
    entry(store, "job-s2", "train", "fit", "tpu-v6e-8", now - day, 3600, capacity="flex-start")
    entry(store, "job-g", "train", "eval", "gpu-h100x8", now - day, 900, capacity="reservation:r1")

    got = as_json("--since", "7d")
    assert got["by"] == "dag" and got["priced"] is False
    assert [g["dag_id"] for g in got["groups"]] == ["train"]
    train = got["groups"][0]
    # 4 + 8 chip-hours of v6e, 2 of H100; each waited 60 s.
    assert (train["chip_hours"], train["attempts"], train["queued_s"]) == (14.0, 3, 180.0)
    assert got["total"]["chip_hours"] == 14.0
    only = as_json("--dag-id", "etl")  # no window: the old job counts
    assert [g["dag_id"] for g in only["groups"]] == ["etl"]
    assert (only["total"]["attempts"], only["total"]["chip_hours"]) == (1, 8.0)

    by_cap = {g["capacity"]: g["chip_hours"] for g in as_json("--by", "capacity")["groups"]}
    assert by_cap == {"on-demand": 8.0, "spot": 4.0, "flex-start": 8.0, "reservation:r1": 2.0}

    prices = tmp_path / "prices.csv"
    prices.write_text(HEADER + "v6e,spot,1.00\ntpu-v6e,*,2.50\nh100,reservation:r1,10\n")
    env = {"AIRFLOW__KINETIC__PRICE_TABLE": str(prices)}
    priced = as_json("--since", "7d", "--by", "task", env=env)
    assert priced["priced"] is True
    costs = {g["task_id"]: g["cost"] for g in priced["groups"]}
    assert costs == {"fit": 4 * 1.0 + 8 * 2.5, "eval": 2 * 10.0}
    assert priced["total"]["cost"] == 44.0 and priced["total"]["unpriced_chip_hours"] == 0
    table = cli("--since", "7d", "--by", "task", env=env).stdout.splitlines()
    assert table[0].split()[-2:] == ["COST", "UNPRICED"]
    assert table[-1].startswith("(total)") and table[-1].split()[-1] == "$44.00"

    prices.write_text(HEADER + "v6e,sport,1\n")
    bad = cli("--by", "task", ok=False, env=env)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == (
        f"error: price table {prices}, line 2 ('v6e,sport,1'): unknown capacity 'sport': "
        "expected one of on-demand, spot, flex-start, reservation, queue, class, KIND:NAME or *"
    )
