"""Keys as a Kinetic task's output and input under real ``dag.test()`` on the local
backend: ``output_key`` puts a succeeded job's output dir (templated key, version row
in XCom, asset event for ``kinetic://KEY`` that queues a DAG scheduled on it), never a
failed job's; ``Data("kinetic://KEY")`` reads the key's version pinned for the DAG
run (a retry reads it although the key moved on; a new run resolves anew); a missing
key fails before any job is submitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.pins import read_pins
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.cli import run_cli

FILE = "kinetic_keyio_dags.py"
DAY = pendulum.datetime(2026, 11, 22, tz="UTC")


def _x(dr: Any) -> dict[tuple[str, str], Any]:
    return {(t, k): v for (t, k, _), v in xcoms(dr).items()}


def _keys(airflow_home: Path) -> KeyStore:
    return KeyStore(KineticConfig(backend="local", root=str(airflow_home / "kinetic")).store())


def _gc(airflow_home: Path) -> dict[str, str]:
    """``airflow kinetic data gc --older-than 0s --dry-run`` (the CLI's ``main`` in this
    process, on the session's Airflow database): hash -> action."""
    out = run_cli("data", "gc", "--older-than", "0s", "--dry-run", "-o", "json")
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["hash"]: r.get("action") for r in json.loads(out.stdout) if r["kind"] == "data"}


def _queued_for(dag_id: str) -> list[str]:
    """Asset URIs that have queued a run of ``dag_id`` (the scheduler's next run)."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetModel.uri)
            .join(AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id)
            .filter(AssetDagRunQueue.target_dag_id == dag_id)
        )
        return sorted(r[0] for r in rows)


def test_output_key_then_read_by_key_pinned_per_run(
    load_dag, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KINETIC_KEYIO_TEST_DIR", str(tmp_path))
    keys = _keys(airflow_home)

    # A failed job never moves its key (nothing is put, not even what it wrote).
    failed = load_dag(FILE, "kinetic_keyio_train_fails").test(logical_date=DAY)
    assert task_states(failed) == {("train", -1): "failed"}
    assert keys.state("keyio/never") is None

    # Train: the output dir becomes the templated key's version; row in XCom.
    dr = load_dag(FILE, "kinetic_keyio_train").test(logical_date=DAY)
    assert dr.state == "success", task_states(dr)
    row = _x(dr)[("train", "kinetic_output_key")]
    state = keys.state("keyio/churn")
    assert state is not None and [v.version for v in state.versions] == [row["version"]]
    assert row["new"] is True and row["files"] == 1 and row["size"] == 2
    by = state.current.by
    assert (by["dag_id"], by["task_id"]) == ("kinetic_keyio_train", "train")
    assert by["run_id"] == dr.run_id
    assert by["job_id"] == _x(dr)[("train", "kinetic_job")]["job_id"]
    # Its asset event queued the DAG scheduled on Asset("kinetic://keyio/churn").
    assert _queued_for("kinetic_keyio_on_key") == ["kinetic://keyio/churn"]

    # (The same content again makes no second version: tests/unit/operators/test_keyio_unit.py.)

    # Score: try 1 reads v1, moves the key on from inside its job, fails; try 2 reads
    # the version the run pinned, not the new current one.
    scored = load_dag(FILE, "kinetic_keyio_score").test(logical_date=DAY)
    assert scored.state == "success", task_states(scored)
    x = _x(scored)
    assert x[("score", "return_value")] == {"read": "v1"}
    assert x[("score", "kinetic_keys")] == [
        {"key": "keyio/churn", "version": row["version"], "source": "recorded"}
    ]
    moved = keys.state("keyio/churn").current.version
    assert moved != row["version"]
    identity = {"dag_id": "kinetic_keyio_score", "run_id": scored.run_id, "task_id": "score",
                "map_index": -1}  # fmt: skip
    assert read_pins(keys.store, identity) == {"keyio/churn": row["version"]}
    job = x[("score", "kinetic_job")]
    assert job["data_keys"][0]["version"] == row["version"]  # the handle names it
    entry = history.read(keys.store, job["job_id"]) or {}
    assert row["version"] in entry.get("data_hashes", [])  # data gc keeps it

    # A new run resolves anew: it reads the moved-on version.
    fresh = load_dag(FILE, "kinetic_keyio_score").test(logical_date=DAY.add(days=1))
    assert fresh.state == "success", task_states(fresh)
    assert _x(fresh)[("score", "return_value")] == {"read": "moved on"}
    assert _x(fresh)[("score", "kinetic_keys")][0] == {
        "key": "keyio/churn", "version": moved, "source": "resolved"
    }  # fmt: skip

    # data gc: with the key removed, what a job in the history reads, or an XCom
    # names, stays; a cache entry nothing points to goes.
    keys.rm("keyio/churn")
    (tmp_path / "loose").write_text("nobody holds me")
    loose = KeyStore(keys.store).put("keyio/loose", tmp_path / "loose")["version"]
    keys.rm("keyio/loose")
    gc = _gc(airflow_home)
    assert gc[row["version"]].startswith("kept: ")
    assert f"history entry of {job['job_id']}" in gc[row["version"]]
    assert gc[loose] == "would delete"
    for entry in history.entries(keys.store):  # the history goes: the XComs still hold
        if entry.get("dag_id") in ("kinetic_keyio_score", "kinetic_keyio_train"):
            history.remove(keys.store, entry["job_id"])
    gc = _gc(airflow_home)
    assert "XCom kinetic_" in gc[row["version"]], gc[row["version"]]  # pins too (core.jobs.holds)
    assert "XCom kinetic_" in gc[moved], gc[moved]

    # The score run made again under the same run id (dag.test deletes it and makes
    # it anew) is a new run: it resolves the key anew instead of reading the earlier
    # instance's pin (core/keys/pins.same_run_instance).
    keys.put("keyio/churn", tmp_path / "newer")  # (removed for the gc check above)
    again = load_dag(FILE, "kinetic_keyio_score").test(logical_date=DAY, run_after=scored.run_after)
    assert again.state == "success" and again.run_id == scored.run_id, task_states(again)
    assert _x(again)[("score", "return_value")] == {"read": "moved on"}
    (pin,) = _x(again)[("score", "kinetic_keys")]
    assert pin["source"] == "resolved" and pin["version"] == moved


def test_a_missing_key_fails_before_any_job(
    load_dag, airflow_home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    keys = _keys(airflow_home)
    (tmp_path / "m.txt").write_text("x")
    keys.put("keyio/churn-near", tmp_path / "m.txt")
    dr = load_dag(FILE, "kinetic_keyio_missing").test(logical_date=DAY)
    assert task_states(dr) == {("score", -1): "failed"}
    ours = [e for e in history.entries(keys.store) if e.get("dag_id") == "kinetic_keyio_missing"]
    assert ours == []  # nothing was submitted
    out = capfd.readouterr()
    text = out.out + out.err  # the task's log: the key, and the nearest keys
    assert "KeyNotFound: no key 'keyio/chrun'" in text and "keyio/churn-near" in text


def test_a_batch_reads_a_key_pinned_for_its_run(load_dag, airflow_home: Path, tmp_path) -> None:
    keys = _keys(airflow_home)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.txt").write_text("batch model")
    put = keys.put("keyio/map-model", tmp_path / "m")
    dr = load_dag(FILE, "kinetic_keyio_map").test(logical_date=DAY)
    assert dr.state == "success", task_states(dr)
    x = _x(dr)
    assert x[("batch", "return_value")] == ["1:batch model", "2:batch model"]
    assert x[("batch", "kinetic_keys")] == [
        {"key": "keyio/map-model", "version": put["version"], "source": "resolved"}
    ]
    identity = {"dag_id": "kinetic_keyio_map", "run_id": dr.run_id, "task_id": "batch",
                "map_index": -1}  # fmt: skip
    assert read_pins(keys.store, identity) == {"keyio/map-model": put["version"]}
