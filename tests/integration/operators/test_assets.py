"""Assets under real Airflow ``dag.test()``: a Kinetic task's output dir as an asset
event (through its alias, or on the user's declared outlets), Data of assets as
inlets, and output dirs Airflow would refuse failing when the DAG file is parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_provider_kinetic import Data, KineticRunOperator
from airflow_provider_kinetic.operators.assets import alias_name, asset_uri
from airflow_provider_kinetic.operators.map import KineticMapOperator
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


def test_a_successful_job_emits_its_output_dir_through_the_task_alias(load_dag):
    """The run's output dir through the task's alias; a key's version is an event of
    its own asset with the same extra (issue 42: one extra shape on the alias)."""
    dag = load_dag(FILE, "kinetic_asset_emit")
    aliases = {t.task_id: [o.name for o in t.outlets] for t in dag.tasks}
    assert aliases == {
        "train": ["kinetic:kinetic_asset_emit/train"],
        "big": ["kinetic:kinetic_asset_emit/big"],
        "quiet": [],
        "keyed": ["kinetic:kinetic_asset_emit/keyed"],
    }
    dr, x = _run(load_dag, "kinetic_asset_emit")
    events = _events(dr)
    assert set(events) == {"train", "big", "keyed"}  # output_asset=False: no event
    (train,) = events["train"]
    out = x[("train", "output_dir")]
    assert out.startswith("file://") and train["uri"] == asset_uri(out) == out.rstrip("/")
    assert train["aliases"] == [alias_name("kinetic_asset_emit", "train")]
    job = x[("train", "kinetic_job")]
    extra = train["extra"]
    assert extra["output_dir"] == out and extra["job_id"] == job["job_id"]
    assert extra["accelerator"] == "cpu" and extra["backend"] == "local"
    assert extra["value"] == {"loss": 0.25, "n": 3}
    # The usage record (as XCom kinetic_usage): what the job held and for how long.
    assert extra["usage"] == x[("train", "kinetic_usage")] and extra["usage"]["attempts"] == 1
    assert Data(extra["output_dir"]).is_dir  # the extra's dir is a Data directory
    (big,) = events["big"]
    assert "value" not in big["extra"]  # more than 4 KiB of JSON
    assert big["uri"] != train["uri"]
    # output_key: the output's event and the key's, both with the output dir and job.
    keyed = {e["uri"]: e for e in events["keyed"]}
    keyed_out = x[("keyed", "output_dir")]
    assert set(keyed) == {asset_uri(keyed_out), "kinetic://assets/keyed"}
    key_extra = keyed["kinetic://assets/keyed"]["extra"]
    assert key_extra["output_dir"] == x[("keyed", "output_dir")]
    assert key_extra["job_id"] == x[("keyed", "kinetic_job")]["job_id"]
    assert key_extra["key"] == "assets/keyed"
    assert key_extra["version"] == x[("keyed", "kinetic_output_key")]["version"]
    assert {e["aliases"][0] for e in events["keyed"]} == {"kinetic:kinetic_asset_emit/keyed"}
    assert keyed[asset_uri(keyed_out)]["extra"]["output_dir"] == keyed_out


def test_user_declared_outlets_get_the_extra(load_dag):
    dag = load_dag(FILE, "kinetic_asset_declared")
    (task,) = dag.tasks
    assert [getattr(o, "uri", o.name) for o in task.outlets] == [
        "file:///declared/model",
        "my-models",
    ]  # no kinetic alias of its own
    dr, x = _run(load_dag, "kinetic_asset_declared")
    events = {e["uri"]: e for e in _events(dr)["train"]}
    out = x[("train", "output_dir")]
    assert set(events) == {"file:///declared/model", out.rstrip("/")}
    declared = events["file:///declared/model"]
    assert declared["extra"]["output_dir"] == out and declared["extra"]["value"]["n"] == 3
    assert declared["aliases"] == []
    assert events[out.rstrip("/")]["aliases"] == ["my-models"]


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
    (event,) = _events(dr)["sweep"]
    assert event["uri"] == x[("sweep", "output_dir")].rstrip("/")
    assert event["aliases"] == ["kinetic:kinetic_asset_map/sweep"]
    extra = event["extra"]
    assert extra["children"] == 3 and extra["value"] == [1, 4, 9]
    assert extra["output_dirs"] == x[("sweep", "kinetic_output_dirs")]
    assert extra["usage"] == x[("sweep", "kinetic_usage")] and extra["usage"]["jobs"] == 3


@pytest.mark.parametrize(
    "output_dir, reason",
    [
        ("airflow://bucket/{{ ds }}", "'airflow' is reserved"),
        ("gs:///no-bucket/{{ ds }}", "must contain a bucket name"),
        ("gs://b/" + "x" * 1500, "cannot exceed 1500 characters"),
    ],
)
@pytest.mark.parametrize("operator", ["run", "map"])
def test_an_output_dir_airflow_refuses_fails_at_parse_time(operator, output_dir, reason):
    from airflow.sdk import DAG

    with (
        DAG("kinetic_asset_refused", schedule=None, start_date=LOGICAL),
        pytest.raises(ValueError, match=reason) as err,
    ):
        if operator == "run":
            KineticRunOperator(task_id="t", python_callable=len, output_dir=output_dir)
        else:
            KineticMapOperator(task_id="t", python_callable=len, inputs=[1], output_dir=output_dir)
    assert "task 't': output_dir" in str(err.value)
    # The same dir without asset events is the task's own business.
    with DAG("kinetic_asset_refused_off", schedule=None, start_date=LOGICAL):
        KineticRunOperator(
            task_id="t", python_callable=len, output_dir=output_dir, output_asset=False
        )


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
    (event,) = _events(dr)["train"]
    assert event["aliases"] == ["kinetic:asset_train/train"]
    assert event["extra"]["output_dir"] == x[("train", "output_dir")]
    assert event["extra"]["value"]["ds"] == "2026-11-21"
    model_dir = Path(x[("train", "output_dir")][len("file://") :])
    assert (model_dir / "model.json").exists()
    # A manual run of the evaluation has no triggering event: nothing to evaluate.
    dr = load_dag("asset_evaluate.py", "asset_evaluate").test(logical_date=LOGICAL)
    assert dr.state == "success", task_states(dr)
