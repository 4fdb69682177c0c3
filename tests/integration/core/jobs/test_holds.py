"""What is still needed (``core/jobs/holds.py``): every deletion path asks one function, and a
kept object says what holds it.  Local store and backend; the CLI's ``main`` called in
this process (``tests/fixtures/cli.py``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import resume as batchresume
from airflow_provider_kinetic.core.batch.finish import batch_ended
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.state import FAILED, SUCCEEDED
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import marker_key
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.holds import KEY_VERSION, Ref, key_holds
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.pins import pin_values
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.batch_drive import drive
from tests.fixtures.cli import run_cli

CONN = "kn_holds"
SECRET = b"s" * 32


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_home: Path) -> KineticConfig:
    """A local connection; Airflow's metadata DB exists (``jobs cleanup`` reads XComs)."""
    extra = {"backend": "local", "root": str(tmp_path / "root")}
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({"conn_type": "kinetic", "extra": extra})
    )
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "statcache"))
    return KineticConfig(**extra)


def cli(*args: str) -> Any:
    out = run_cli(*args, "--conn-id", CONN, "-o", "json")
    assert out.returncode == 0, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
    return json.loads(out.stdout)


def read(table: str) -> int:
    return len(os.listdir(table))


def flaky(x: int, flag_dir: str) -> int:
    """Input 1 always fails; input 0 fails on its first launch only."""
    if x == 1:
        raise ValueError("input 1 always fails")
    flag = os.path.join(flag_dir, "tried")
    if not os.path.exists(flag):
        open(flag, "w").close()  # noqa: SIM115 - a marker, nothing written
        raise ValueError("input 0 fails once")
    return x * 10


def test_data_gc_keeps_a_running_batchs_data(config: KineticConfig, tmp_path: Path) -> None:
    """Case 9: a batch names what it reads in its history entry from its start, so
    ``data gc`` meanwhile keeps it (before: deleted, its children then failed with a
    misleading DataHashMismatch)."""
    table = tmp_path / "table"
    table.mkdir()
    (table / "t").write_text("rows")
    store = config.store()
    request = JobRequest(func=read, kwargs={"table": Data(str(table))})
    state, objects, local = plan_batch(
        request, [1, 2], "single", store, config=config, max_concurrent=2, retries=0,
        fail_fast=False,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)  # its children not launched yet
    digest = local[0].content_hash()
    assert history.read(store, state.group_id)[history.DATA_HASHES] == [digest]

    rows = cli("data", "gc", "--older-than", "0s", "--force")
    row = next(r for r in rows if r["hash"] == digest)
    assert row["action"].startswith("kept: running batch " + state.group_id), row
    assert f"history entry of {state.group_id}" in row["held_by"]
    assert store.exists(marker_key(digest))


@pytest.mark.timeout(300)
def test_a_succeeded_child_is_not_run_again_after_cleanup_always(
    config: KineticConfig, tmp_path: Path
) -> None:
    """Case 6: a batch that failed as a whole under ``cleanup="always"`` deleted the
    artifacts of input 0's failed first launch; the retry's resume stopped at that gap
    ("resumed: 0 succeeded") and ran the succeeded child again.  Now the launch count
    outlives the cleanup, and the succeeded child is held for the retry."""
    flags = tmp_path / "flags"
    flags.mkdir()
    store = LocalStore(config.root)
    backend = LocalBackend(config.root)
    request = JobRequest(func=flaky, kwargs={"flag_dir": str(flags)})
    state, objects, local = plan_batch(
        request, [0, 1], "single", store, config=config, max_concurrent=2, retries=1,
        fail_fast=False,
    )  # fmt: skip
    batchresume.save_plan(store, state, SECRET)
    batchlaunch.start_batch(state, objects, local, store)
    drive(state, config, backend, store)
    assert state.done == {0: SUCCEEDED, 1: FAILED} and state.launches == {0: 2, 1: 2}
    first = batchlaunch.child_job_id(state.group_id, 0, 1)
    succeeded = state.jobs[0]
    batch_ended(state, store, backend, delivered=False, cleanup="always")
    assert store.list(f"{first}/") == [] and store.exists(f"{succeeded}/result.pkl")

    # jobs cleanup keeps the succeeded child for the retry, and says why.
    rows = cli("jobs", "cleanup", "--older-than", "0s", "--dry-run")
    kept = next(r for r in rows if r["job_id"] == succeeded)
    assert kept["held_by"] == [f"batch {state.group_id} input 0 (retryable)"], kept

    resumed = batchresume.resume_batch(
        store, backend, config, state.group_id, SECRET, lambda _h: None, cancel_live=False
    )
    assert resumed.done == {0: SUCCEEDED} and resumed.queue == [1]
    assert resumed.jobs[0] == succeeded and resumed.launches[0] == 2


def test_jobs_cleanup_removes_a_submit_killed_before_create(config: KineticConfig) -> None:
    """A submit killed between its upload and its create leaves ``{job_id}/payload.pkl``
    and nothing else: no handle, no history entry.  ``jobs cleanup`` removes it once
    older than the grace period, saying so; a young one may be a submit under way."""
    store = config.store()
    store.write_bytes("job-0dead001/payload.pkl", b"x" * 100)
    store.write_bytes("job-0dead002/payload.pkl", b"y")  # just now: kept, not listed
    old = time.time() - 2 * 3600
    os.utime(Path(config.root) / "job-0dead001" / "payload.pkl", (old, old))

    dry = [r for r in cli("jobs", "cleanup", "--dry-run") if r["what"] == "orphan artifacts"]
    assert [(r["job_id"], r["objects"], r["bytes"]) for r in dry] == [("job-0dead001", 1, 100)]
    assert dry[0]["action"].startswith("would delete") and store.exists("job-0dead001/payload.pkl")
    done = [r for r in cli("jobs", "cleanup") if r["what"] == "orphan artifacts"]
    assert [r["action"].split(" (")[0] for r in done] == ["deleted"]
    assert store.list("job-0dead001/") == [] and store.exists("job-0dead002/payload.pkl")


def test_a_pinned_version_outlives_store_keep_versions(
    config: KineticConfig, tmp_path: Path
) -> None:
    """A task's pin names the version its first try read; a retry reads it again, so
    puts beyond ``store_keep_versions`` must not cut it from the key's record."""
    store = config.store()
    keys = KeyStore(store, keep=2)
    src = tmp_path / "m"
    src.write_text("one")
    first = keys.put("models/churn", src)["version"]
    identity = {"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": -1}
    _, pins = pin_values(store, identity, [Data("kinetic://models/churn")])
    assert [p.version for p in pins] == [first]
    for text in ("two", "three", "four"):
        src.write_text(text)
        keys.put("models/churn", src)
    _, found = keys.resolve("models/churn", first)  # KeyNotFound before
    assert found.version == first
    assert len(keys.state("models/churn").versions) == 3  # the 2 newest + the pinned one
    holders = key_holds(keys, time.time()).of(Ref(KEY_VERSION, f"models/churn@{first}"))
    assert [str(h) for h in holders] == ["pin d/r/t"]
