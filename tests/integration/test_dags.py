"""Real Airflow 3.3 ``dag.test()`` runs on the embedded local backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.spec.identity import key_part
from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")


def _xcoms(dr) -> dict[tuple[str, str], object]:
    return {(t, k): v for (t, k, _), v in xcoms(dr).items()}


def _states(dr) -> dict[str, str]:
    return {t: s for (t, _), s in task_states(dr).items()}


def test_example_retrain_daily_end_to_end(load_dag, airflow_home: Path):
    dag = load_dag("retrain_daily.py", "retrain_daily")
    store = airflow_home / "kinetic" / "default"
    # The session's store: other tests' data may already be there.
    before = set((store / "data-markers").iterdir()) if (store / "data-markers").is_dir() else set()
    dr = dag.test(logical_date=LOGICAL)
    assert dr.state == "success", _states(dr)
    assert _states(dr) == {
        "make_dataset": "success",
        "train": "success",
        "check_outputs": "success",
    }
    x = _xcoms(dr)
    metrics = x[("train", "return_value")]
    assert metrics["rows"] == 512 and metrics["epochs"] == 200
    assert metrics["final_loss"] < metrics["initial_loss"] / 100
    job = x[("train", "kinetic_job")]
    assert job["backend"] == "local" and job["job_id"].startswith("job-")
    assert job["func_name"] == "train_fn" and job["accelerator"] == "cpu"
    assert job["version"] == 1 and job["bucket_name"] == str(airflow_home / "kinetic")
    # The extra link's URL is pushed before the task waits: the plugin's Kinetic page.
    assert x[("train", "kinetic_job_link")] == f"/kinetic/jobs/{job['job_id']}"
    out = x[("train", "output_dir")]
    assert out == (
        f"file://{airflow_home}/kinetic/outputs/retrain_daily/{key_part(dr.run_id)}/train/-1"
    )
    out_path = Path(out[len("file://") :])
    assert json.loads((out_path / "metrics.json").read_text()) == metrics
    assert (out_path / "model.pt").stat().st_size > 0
    assert x[("check_outputs", "return_value")]["files"] == ["metrics.json", "model.pt"]
    # The dataset was uploaded (once) to kinetic's cache layout with its marker.
    markers = sorted(set((store / "data-markers").iterdir()) - before)
    assert len(markers) == 1 and (store / "data-cache" / markers[0].name).is_dir()


def test_failing_function_fails_task_with_remote_traceback(load_dag, capfd):
    dag = load_dag("kinetic_test_dags.py", "kinetic_fail")
    dr = dag.test(logical_date=LOGICAL)
    assert dr.state == "failed"
    assert _states(dr) == {"explode": "failed"}
    out = "".join(capfd.readouterr())
    assert "ValueError: boom 42 from the remote side" in out
    assert "Remote traceback" in out and "in fails_loudly" in out
    assert _xcoms(dr)[("explode", "kinetic_job")]["func_name"] == "fails_loudly"


def test_sync_nested_data_volumes_and_templates(load_dag, tmp_path, monkeypatch):
    data = Path(os.environ["KINETIC_TEST_DATA"])
    dag = load_dag("kinetic_test_dags.py", "kinetic_sync_nested")
    dr = dag.test(logical_date=LOGICAL)
    assert dr.state == "success", _states(dr)
    value = _xcoms(dr)[("nested", "return_value")]
    assert value["cfg"] == "config for 2026-11-20"
    assert value["shards"] == [["a1.txt", "a2.txt"], ["b1.txt"]]
    assert value["volume"] == ["a1.txt", "a2.txt"]
    # On the local backend the volume was a link at the (host) mount path, to the
    # read-only cache entry, removed when the job ended: nothing is left there.
    assert not os.path.lexists(data / "mnt-2026-11-20")
    assert value["output_dir"].endswith(
        "/kinetic_sync_nested/" + key_part(dr.run_id) + "/nested/-1"
    )


def test_bad_accelerator_fails_before_upload(load_dag, airflow_home: Path, capfd):
    dag = load_dag("kinetic_test_dags.py", "kinetic_bad_accelerator")
    before = sorted(p.name for p in (airflow_home / "kinetic").glob("job-*"))
    dr = dag.test(logical_date=LOGICAL)
    assert dr.state == "failed"
    out = "".join(capfd.readouterr())
    assert "tpu-v9z-3" in out and "Allowed forms" in out
    assert sorted(p.name for p in (airflow_home / "kinetic").glob("job-*")) == before
    assert ("bad", "kinetic_job") not in _xcoms(dr)


@pytest.fixture(autouse=True, scope="module")
def _test_data(tmp_path_factory):
    root = Path(os.environ["KINETIC_TEST_DATA"])
    (root / "2026-11-20").mkdir(parents=True, exist_ok=True)
    (root / "2026-11-20" / "config.txt").write_text("config for 2026-11-20\n")
    for shard, names in {"a": ["a1", "a2"], "b": ["b1"]}.items():
        (root / "shards" / shard).mkdir(parents=True, exist_ok=True)
        for n in names:
            (root / "shards" / shard / f"{n}.txt").write_text(n)
    os.environ["KINETIC_TEST_VOLUME"] = str(root / "mnt-2026-11-20")
    yield


def test_task_kinetic_decorator_runs_gpu_job_locally_on_cpu(load_dag, capfd, caplog):
    dag = load_dag("kinetic_test_dags.py", "kinetic_taskflow")
    dr = dag.test(logical_date=LOGICAL)
    assert dr.state == "success", _states(dr)
    x = _xcoms(dr)
    # The module-level helper travelled by value; no GPU here, so JAX is sent to the CPU.
    assert x[("squares", "return_value")] == {"sum": 285, "jax": "cpu"}
    assert x[("squares", "kinetic_job")]["accelerator"] == "gpu-l4"
    log = "".join(capfd.readouterr()) + caplog.text
    assert "no GPU on this machine: running gpu-l4x1 job on the CPU" in log


def test_job_sensor_poke_and_deferrable(load_dag):
    dag = load_dag("kinetic_test_dags.py", "kinetic_sensor")
    dr = dag.test(logical_date=LOGICAL)
    states = _states(dr)
    assert states["ok"] == "success" and states["bad"] == "failed"
    assert states["wait_ok_poke"] == "success" and states["wait_ok_defer"] == "success"
    assert states["wait_bad_poke"] == "failed" and states["wait_bad_defer"] == "failed"
