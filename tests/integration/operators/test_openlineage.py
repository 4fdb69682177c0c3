"""OpenLineage events of Kinetic tasks, emitted by the REAL OpenLineage provider.

The DAGs of ``tests/dags/kinetic_lineage_dags.py`` run under ``dag.test()`` in a fresh
interpreter configured with the provider's file transport (the provider reads its
configuration once per process and registers its listener only when a transport is
set, so the rest of the session stays without it); the events are read back from
the file.  Dataset naming is checked exactly (``file://{host}`` + absolute path,
``gs://bucket`` + key, ``hf://datasets`` + repo id), the content-hash facet against
the ``Data``'s own hash, the run facet against the XComs the tasks pushed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.storage.fileuri import file_uri_path
from airflow_provider_kinetic.operators.lineage import handle_of
from airflow_provider_kinetic.operators.lineage_names import dataset_name

REPO = Path(__file__).resolve().parents[3]
DAG_FILE = "kinetic_lineage_dags.py"

RUNNER = r"""
import importlib.util, json, sys
import pendulum
from tests.fixtures.airflow_env import task_states, xcoms

path, out = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("kinetic_test_dag_lineage", path)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
found = {}
for dag in (module.run_dag, module.map_dag, module.sensor_dag, module.fail_dag):
    dr = dag.test(logical_date=pendulum.datetime(2026, 11, 21, tz="UTC"))
    found[dag.dag_id] = {
        "state": str(dr.state),
        "tasks": {f"{t}|{m}": s for (t, m), s in task_states(dr).items()},
        "xcoms": {f"{t}|{k}": v for (t, k, m), v in xcoms(dr).items()},
    }
with open(out, "w") as f:
    json.dump(found, f, default=str)
"""


def _write_data(root: Path) -> None:
    for rel, text in {
        "train/a.txt": "1",
        "train/b.txt": "22",
        "lr.txt": "0.03",
        "shards/a/x.bin": "x",
        "shards/b/y.bin": "y",
        "shards/b/z.bin": "zz",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture(scope="module")
def lineage_run(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every lineage DAG once with the file transport; the events and the runs."""
    root = Path(os.environ["KINETIC_TEST_DATA"]) / "lineage"
    _write_data(root)
    work = tmp_path_factory.mktemp("openlineage")
    events, out = work / "events.jsonl", work / "runs.json"
    env = os.environ.copy()
    env.update(
        {
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(events), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "kinetic-tests",
            "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        }
    )
    dag_path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / DAG_FILE
    script = work / "run_lineage_dags.py"  # a file: under ``python -c`` no task event
    script.write_text(RUNNER)  # is emitted (the provider's listener stays silent)
    proc = subprocess.run(
        [sys.executable, str(script), str(dag_path), str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    (work / "runner.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = events.read_text().splitlines() if events.exists() else []
    assert lines, "no OpenLineage event was written:\n" + proc.stderr[-6000:]
    return {"events": [json.loads(x) for x in lines], "runs": json.loads(out.read_text())}


def _host() -> str:
    from airflow.utils.net import get_hostname

    return get_hostname()


def _event(run: dict[str, Any], job: str, kind: str) -> dict[str, Any]:
    found = [e for e in run["events"] if e["job"]["name"] == job and e["eventType"] == kind]
    assert len(found) == 1, (job, kind, [(e["job"]["name"], e["eventType"]) for e in run["events"]])
    return found[0]


def _datasets(event: dict[str, Any], side: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["namespace"], d["name"]): d.get("facets", {}) for d in event[side]}


def test_run_operator_inputs_hashes_output_and_job(lineage_run):
    run = lineage_run["runs"]["kinetic_lineage_run"]
    assert run["state"] == "success", run["tasks"]
    root = Path(os.environ["KINETIC_TEST_DATA"]) / "lineage"
    ns = f"file://{_host()}"
    train, lr = (ns, str(root / "train")), (ns, str(root / "lr.txt"))

    start = _event(lineage_run, "kinetic_lineage_run.train", "START")
    assert set(_datasets(start, "inputs")) == {train, lr}
    facets = _datasets(start, "inputs")[train]
    assert "contentHash" not in facets["kineticData"]  # left to complete: nothing hashed twice
    assert start["run"]["facets"]["kinetic"]["accelerator"] == "cpu"

    done = _event(lineage_run, "kinetic_lineage_run.train", "COMPLETE")
    inputs = _datasets(done, "inputs")
    assert set(inputs) == {train, lr}
    for key, data in ((train, Data(str(root / "train") + "/")), (lr, Data(str(root / "lr.txt")))):
        facet = inputs[key]["kineticData"]
        assert facet["contentHash"] == data.content_hash() and facet["hashedAt"] == "submit"
        assert inputs[key]["version"]["datasetVersion"] == data.content_hash()
        assert facet["_producer"].startswith("https://pypi.org/project/airflow-provider-kinetic/")
        assert facet["_schemaURL"].startswith("https://openlineage.io/spec/")
    assert inputs[train]["kineticData"]["argument"] == "op_kwargs['data']"
    assert inputs[lr]["kineticData"]["argument"] == "op_kwargs['cfg']"

    out_dir = run["xcoms"]["train|output_dir"]
    assert set(_datasets(done, "outputs")) == {(ns, file_uri_path(out_dir).rstrip("/"))}
    kinetic = done["run"]["facets"]["kinetic"]
    job = run["xcoms"]["train|kinetic_job"]
    assert kinetic["jobId"] == job["job_id"] and kinetic["jobIds"] == [job["job_id"]]
    assert kinetic["accelerator"] == "cpu" and kinetic["backend"] == "local"
    assert kinetic["state"] == "SUCCEEDED" and kinetic["capacity"]
    assert kinetic["usage"]["attempts"] == 1 and kinetic["usage"]["run_s"] >= 0
    assert kinetic["usage"]["accelerator"] == "cpu"

    # @task.kinetic: the same methods (KineticDecoratedOperator is a KineticRunOperator).
    count = _event(lineage_run, "kinetic_lineage_run.count", "COMPLETE")
    assert set(_datasets(count, "inputs")) == {train}
    assert count["run"]["facets"]["kinetic"]["jobId"] == run["xcoms"]["count|kinetic_job"]["job_id"]


def test_map_operator_batch_facets(lineage_run):
    run = lineage_run["runs"]["kinetic_lineage_map"]
    assert run["state"] == "success", run["tasks"]
    root = Path(os.environ["KINETIC_TEST_DATA"]) / "lineage"
    ns = f"file://{_host()}"
    done = _event(lineage_run, "kinetic_lineage_map.sweep", "COMPLETE")
    inputs = _datasets(done, "inputs")
    assert set(inputs) == {(ns, str(root / "shards/a")), (ns, str(root / "shards/b"))}
    b = inputs[(ns, str(root / "shards/b"))]["kineticData"]
    assert b["contentHash"] == Data(str(root / "shards/b")).content_hash()
    assert b["argument"] == "inputs[1]"
    kinetic = done["run"]["facets"]["kinetic"]
    assert kinetic["groupId"] == run["xcoms"]["sweep|kinetic_batch"]["group_id"]
    assert kinetic["childJobCount"] == 2 and len(kinetic["childJobIds"]) == 2
    assert kinetic["state"] == "SUCCEEDED" and kinetic["usage"]["jobs"] == 2
    out_dir = run["xcoms"]["sweep|output_dir"]
    assert set(_datasets(done, "outputs")) == {(ns, file_uri_path(out_dir).rstrip("/"))}


def test_sensors_name_the_job_they_waited_for(lineage_run):
    run = lineage_run["runs"]["kinetic_lineage_sensor"]
    assert run["state"] == "success", run["tasks"]
    ns = f"file://{_host()}"
    job = run["xcoms"]["submit|kinetic_job"]
    submitted = _event(lineage_run, "kinetic_lineage_sensor.submit", "COMPLETE")
    assert submitted["run"]["facets"]["kinetic"]["jobId"] == job["job_id"]
    waited = _event(lineage_run, "kinetic_lineage_sensor.wait", "COMPLETE")
    kinetic = waited["run"]["facets"]["kinetic"]
    assert kinetic["jobId"] == job["job_id"] and kinetic["state"] == "SUCCEEDED"
    assert kinetic["usage"]["attempts"] == 1
    assert set(_datasets(waited, "outputs")) == {(ns, file_uri_path(job["output_dir"]).rstrip("/"))}
    start = _event(lineage_run, "kinetic_lineage_sensor.wait", "START")
    assert start["run"]["facets"]["kinetic"]["jobId"] == job["job_id"]

    group = run["xcoms"]["submit_batch|return_value"]["group_id"]
    batch = _event(lineage_run, "kinetic_lineage_sensor.wait_batch", "COMPLETE")
    assert batch["run"]["facets"]["kinetic"]["groupId"] == group
    assert batch["run"]["facets"]["kinetic"]["childJobCount"] == 1


def test_failed_job_error_in_fail_event(lineage_run):
    run = lineage_run["runs"]["kinetic_lineage_fail"]
    assert run["state"] == "failed"
    _event(lineage_run, "kinetic_lineage_fail.bad", "START")
    fail = _event(lineage_run, "kinetic_lineage_fail.bad", "FAIL")
    facets = fail["run"]["facets"]
    assert "ValueError: lineage boom 7" in facets["errorMessage"]["message"]
    assert facets["kinetic"]["state"] == "FAILED"
    failure = facets["kinetic"]["failure"]  # what failed, and where
    assert (failure["class"], failure["phase"]) == ("user_error", "execute")
    assert "lineage boom 7" in facets["kinetic"]["reason"]
    assert facets["kinetic"]["jobId"] == run["xcoms"]["bad|kinetic_job"]["job_id"]


# ---- without the events: naming, facets, imports -----------------------------------
@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("gs://bkt/data/train/", ("gs://bkt", "data/train", {})),
        ("gs://bkt/data/x.csv", ("gs://bkt", "data/x.csv", {})),
        ("gs://bkt/", ("gs://bkt", "/", {})),
        ("file:///srv/out/a%20b/", ("file://host1", "/srv/out/a b", {})),
        ("/srv/data/", ("file://host1", "/srv/data", {})),
        (
            "hf://org/name?split=train&revision=abc123",
            ("hf://datasets", "org/name", {"revision": "abc123", "split": "train"}),
        ),
        ("hf://squad", ("hf://datasets", "squad", {})),
    ],
)
def test_dataset_names(uri, expected):
    assert dataset_name(uri, "host1") == expected


def test_gcs_and_hf_datasets_as_openlineage_objects():
    from airflow_provider_kinetic.operators.lineage_facets import to_operator_lineage
    from airflow_provider_kinetic.operators.lineage_names import DataSet, named

    items = [DataSet("gs://bkt/train/", "op_kwargs['d']"), DataSet("hf://org/ds?revision=v1")]
    out = to_operator_lineage(named(items, "h"), [], {"jobId": "job-1", "bogus": 1}, None)
    gcs, hf = out.inputs
    assert (gcs.namespace, gcs.name) == ("gs://bkt", "train") and "version" not in gcs.facets
    assert (hf.namespace, hf.name) == ("hf://datasets", "org/ds")
    assert hf.facets["version"].datasetVersion == "v1"
    assert hf.facets["kineticData"].revision == "v1"
    assert out.run_facets["kinetic"].jobId == "job-1"


def test_sensor_handles_in_every_form():
    assert handle_of({"group_id": "g1"}) == {"group_id": "g1"}
    assert handle_of('{"job_id": "job-2"}') == {"job_id": "job-2"}
    assert handle_of("{'group_id': 'g3', 'ok': True}") == {"group_id": "g3", "ok": True}
    assert handle_of(" g4 ") == {"group_id": "g4"}


def test_every_kinetic_task_has_the_methods():
    from airflow_provider_kinetic.decorators.kinetic import KineticDecoratedOperator
    from airflow_provider_kinetic.operators import lineage
    from airflow_provider_kinetic.operators.map import KineticMapOperator
    from airflow_provider_kinetic.operators.run import KineticRunOperator
    from airflow_provider_kinetic.sensors.batch import KineticBatchSensor
    from airflow_provider_kinetic.sensors.job import KineticJobSensor

    for cls, mixin in (
        (KineticRunOperator, lineage.KineticTaskLineage),
        (KineticMapOperator, lineage.KineticTaskLineage),
        (KineticDecoratedOperator, lineage.KineticTaskLineage),
        (KineticJobSensor, lineage.KineticJobSensorLineage),
        (KineticBatchSensor, lineage.KineticBatchSensorLineage),
    ):
        assert issubclass(cls, mixin)
        for name in ("start", "complete", "failure"):
            method = f"get_openlineage_facets_on_{name}"
            assert getattr(cls, method) is getattr(lineage._LineageMixin, method)


PROBE = r"""
import json, sys
import airflow.sdk  # what a DAG file has already paid for
before = set(sys.modules)
import airflow_provider_kinetic
from airflow_provider_kinetic import KineticRunOperator, KineticMapOperator
from airflow_provider_kinetic import KineticJobSensor, KineticBatchSensor, kinetic_task
import airflow_provider_kinetic.operators.lineage
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_importing_the_provider_imports_no_openlineage(airflow_home):
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "AIRFLOW__OPENLINEAGE__TRANSPORT": '{"type": "console"}'},
    )  # fmt: skip
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert "airflow_provider_kinetic.operators.lineage" in added
    assert [m for m in added if "openlineage" in m or m.endswith("lineage_facets")] == []
