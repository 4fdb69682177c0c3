"""Assets under real Airflow ``dag.test()``: a Kinetic task's output dir as an asset
event (through its alias, or on the user's declared outlets), Data of assets as
inlets, and output dirs Airflow would refuse failing when the DAG file is parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_provider_kinetic import Data
from airflow_provider_kinetic.operators.assets import alias_name, task_asset_uri
from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 21, tz="UTC")
FILE = "kinetic_asset_dags.py"


def _run(load_dag, dag_id: str):  # noqa: ANN001, ANN202
    dr = load_dag(FILE, dag_id).test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
    return dr, {(t, k): v for (t, k, _), v in xcoms(dr).items()}


def _events(dr: Any) -> dict[str, list[dict[str, Any]]]:
    """task_id -> [{uri, name, extra, aliases}] of the run's asset events."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    out: dict[str, list[dict[str, Any]]] = {}
    with create_session() as session:
        rows = session.query(AssetEvent).filter(
            AssetEvent.source_dag_id == dr.dag_id, AssetEvent.source_run_id == dr.run_id
        )
        for e in rows:
            out.setdefault(e.source_task_id, []).append(
                {
                    "uri": e.asset.uri,
                    "name": e.asset.name,
                    "extra": dict(e.extra or {}),
                    "aliases": sorted(a.name for a in e.source_aliases),
                }
            )
    return out


def test_a_successful_job_emits_its_task_asset_through_the_task_alias(load_dag):
    """Each task's stable asset and its alias (a fixed key's asset too) are declared at
    parse time; a run adds events, never an asset: the task asset's one event, through
    the alias, with the run's output dir, job and value; a key's
    version is an event of its asset with the same extra (issue 42)."""
    dag = load_dag(FILE, "kinetic_asset_emit")
    outlets = {t.task_id: [getattr(o, "uri", o.name) for o in t.outlets] for t in dag.tasks}
    task = lambda t: task_asset_uri("kinetic_asset_emit", t)  # noqa: E731
    assert outlets == {
        "train": ["kinetic:kinetic_asset_emit/train", task("train")],
        "big": ["kinetic:kinetic_asset_emit/big", task("big")],
        "quiet": [],
        "keyed": [
            "kinetic:kinetic_asset_emit/keyed",
            task("keyed"),
            "kinetic://assets/keyed",
        ],
    }
    dr, x = _run(load_dag, "kinetic_asset_emit")
    events = _events(dr)
    assert set(events) == {"train", "big", "keyed"}  # output_asset=False: no event
    by_alias = {t: [e for e in events[t] if e["aliases"]] for t in events}
    (train,) = by_alias["train"]  # one event a run through the alias: the task asset's
    out = x[("train", "output_dir")]
    assert out.startswith("file://") and train["uri"] == task("train")
    assert train["aliases"] == [alias_name("kinetic_asset_emit", "train")]
    job = x[("train", "kinetic_job")]
    extra = train["extra"]
    assert extra["output_dir"] == out and extra["job_id"] == job["job_id"]
    assert extra["accelerator"] == "cpu" and extra["backend"] == "local"
    assert extra["value"] == {"loss": 0.25, "n": 3}
    # The usage record (as XCom kinetic_usage): what the job held and for how long.
    assert extra["usage"] == x[("train", "kinetic_usage")] and extra["usage"]["attempts"] == 1
    assert Data(extra["output_dir"]).is_dir  # the extra's dir is a Data directory
    # The alias's event is the task asset's one event of the run: Airflow adds none of
    # its own for the declared outlet (a consumer of either sees the run once).
    assert [e["uri"] for e in events["train"]] == [task("train")]
    (big,) = by_alias["big"]
    assert "value" not in big["extra"]  # more than 4 KiB of JSON
    assert big["uri"] == task("big")
    # output_key: the alias's one event and the key's own, one extra shape with the
    # output dir, the job and the version.
    (keyed,) = by_alias["keyed"]
    key_events = [e for e in events["keyed"] if e["uri"] == "kinetic://assets/keyed"]
    assert keyed["uri"] == task("keyed") and len(key_events) == 1
    row = x[("keyed", "kinetic_output_key")]
    for e in (keyed, key_events[0]):
        assert e["extra"]["output_dir"] == x[("keyed", "output_dir")]
        assert e["extra"]["job_id"] == x[("keyed", "kinetic_job")]["job_id"]
        assert e["extra"]["key"] == "assets/keyed" and e["extra"]["version"] == row["version"]
    assert key_events[0]["extra"] == keyed["extra"]


def test_user_declared_outlets_get_the_extra(load_dag):
    dag = load_dag(FILE, "kinetic_asset_declared")
    (task,) = dag.tasks
    ours = task_asset_uri("kinetic_asset_declared", "train")
    assert [getattr(o, "uri", o.name) for o in task.outlets] == [
        "file:///declared/model",
        "my-models",
        ours,  # the target of the user's alias's event, declared so that it exists
    ]  # no kinetic alias of its own
    dr, x = _run(load_dag, "kinetic_asset_declared")
    events = _events(dr)["train"]
    out = x[("train", "output_dir")]
    assert {e["uri"] for e in events} == {"file:///declared/model", ours}
    (declared,) = [e for e in events if e["uri"] == "file:///declared/model"]
    assert declared["extra"]["output_dir"] == out and declared["extra"]["value"]["n"] == 3
    assert declared["aliases"] == []
    (aliased,) = [e for e in events if e["aliases"]]
    assert aliased["uri"] == ours and aliased["aliases"] == ["my-models"]
    assert aliased["extra"]["output_dir"] == out


def test_data_of_assets_become_inlets(load_dag, airflow_home):
    scratch = Path(airflow_home) / "scratch"
    for name in ("asset-in", "scheduled-in"):
        (scratch / name).mkdir(exist_ok=True)
        (scratch / name / "f.txt").write_text(name)
    dag = load_dag(FILE, "kinetic_asset_inlets")
    (task,) = dag.tasks
    assert sorted(i.uri for i in task.inlets) == [
        f"file://{scratch}/asset-in",
        f"file://{scratch}/scheduled-in",
    ]
    _, x = _run(load_dag, "kinetic_asset_inlets")
    assert x[("use", "return_value")] == 2  # each Data arrived as its directory


def test_a_batch_emits_one_event_for_its_parent_dir(load_dag):
    dr, x = _run(load_dag, "kinetic_asset_map")
    (event,) = [e for e in _events(dr)["sweep"] if e["aliases"]]
    assert event["uri"] == task_asset_uri("kinetic_asset_map", "sweep")
    assert event["aliases"] == ["kinetic:kinetic_asset_map/sweep"]
    extra = event["extra"]
    assert extra["output_dir"] == x[("sweep", "output_dir")]
    assert extra["children"] == 3 and extra["value"] == [1, 4, 9]
    assert extra["output_dirs"] == x[("sweep", "kinetic_output_dirs")]
    assert extra["usage"] == x[("sweep", "kinetic_usage")] and extra["usage"]["jobs"] == 3


def test_data_of_an_asset_is_its_uri_and_pickles_without_it():
    import pickle

    from airflow.sdk import Asset

    asset = Asset("gs://bucket/models/resnet")
    data = Data(asset)
    assert data.path == "gs://bucket/models/resnet" and data.asset is asset
    assert not data.is_dir  # Airflow drops the "/": one object unless told otherwise
    assert Data(asset, directory=True).path == "gs://bucket/models/resnet/"
    assert Data(asset, directory=True).is_dir
    copy = pickle.loads(pickle.dumps(data))
    assert copy == data and copy.asset is None
    with pytest.raises(ValueError, match="literal path"):
        Data("gs://b/{{ ds }}", directory=True)


def test_training_example_publishes_its_model_dir(load_dag):
    dr = load_dag("asset_train.py", "asset_train").test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    (event,) = [e for e in _events(dr)["train"] if e["aliases"]]
    assert event["aliases"] == ["kinetic:asset_train/train"]
    assert event["uri"] == task_asset_uri("asset_train", "train")
    assert event["extra"]["output_dir"] == x[("train", "output_dir")]
    assert event["extra"]["value"]["ds"] == "2026-11-21"
    model_dir = Path(x[("train", "output_dir")][len("file://") :])
    assert (model_dir / "model.json").exists()
    # A manual run of the evaluation has no triggering event: nothing to evaluate.
    dr = load_dag("asset_evaluate.py", "asset_evaluate").test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
