"""Data schemes end to end on the local backend: ``file://`` (an upstream task's
output dir), ``hf://`` (a dataset made locally, served by the Hub double), and the
train -> evaluate example DAG chained through the ``output_dir`` XCom."""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data, content_hash_of
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.waiting import ended, wait_for


def run_local(tmp_path: Path, func, *args, timeout: float = 120.0):
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    # A job sees only the worker variables it captures: the hub double's (``hf_hub``).
    hub = ["HF_*", "NO_PROXY", "no_proxy"]
    handle, _ = submit_job(JobRequest(func=func, args=args, capture_env_vars=hub), config, backend)
    report = wait_for(
        f"job {handle.job_id} to end",
        lambda: ended(backend.status(handle)),
        timeout,
        detail=lambda: backend.read_logs(handle)[0],
    )
    log = backend.read_logs(handle)[0]
    return report, config, handle, log


def list_tree(path: str) -> list[str]:
    import os

    return sorted(
        os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs
    )


def rows_in(path: str, *also: str) -> dict:
    """Rows of the dataset saved at ``path``; ``also`` must be saved datasets too."""
    import os

    import datasets

    ds = datasets.load_from_disk(path)
    for other in also:
        datasets.load_from_disk(other)
    splits = {"all": ds} if isinstance(ds, datasets.Dataset) else dict(ds)
    # Plain lists: a datasets column is memory-mapped from the job's work dir, which
    # the runner removes when the job ends.
    return {"is_dir": os.path.isdir(path), **{k: list(v["x"]) for k, v in splits.items()}}


# ---- file:// ----------------------------------------------------------------------


def test_file_uri_is_local_data_with_the_same_hash(tmp_path):
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "sub" / "m.json").write_text("{}")
    as_uri = Data(f"file://{tmp_path}/out")
    assert as_uri.uploads and as_uri.is_dir and as_uri.local_path == str(tmp_path / "out")
    assert as_uri.content_hash() == Data(str(tmp_path / "out")).content_hash()
    assert Data(f"file://{tmp_path}/out%20x").local_path == f"{tmp_path}/out x"


@pytest.mark.parametrize(
    ("uri", "error", "match"),
    [
        ("file://host/x", ValueError, "must be file:///absolute/path"),
        ("file://relative", ValueError, "must be file:///absolute/path"),
        ("file:///nope/not/here", FileNotFoundError, "does not exist"),
    ],
)
def test_bad_file_uris_are_named(uri, error, match):
    with pytest.raises(error, match=match):
        Data(uri).validate()


def test_file_uri_reaches_the_function_as_a_directory(tmp_path):
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "a.txt").write_text("a")
    (tmp_path / "out" / "sub" / "b.txt").write_text("b")
    report, *_, log = run_local(tmp_path, list_tree, Data(f"file://{tmp_path}/out"))
    assert report.status is JobStatus.SUCCEEDED, log


# ---- hf:// ------------------------------------------------------------------------


def test_hf_dataset_end_to_end_on_the_local_backend(tmp_path, hf_hub):
    hf_hub.add_dataset("org/tiny", {"train": {"x": [1, 2, 3]}, "test": {"x": [7]}})
    report, config, handle, log = run_local(
        tmp_path, rows_in, Data("hf://org/tiny?split=train"), Data("hf://org/tiny")
    )
    assert report.status is JobStatus.SUCCEEDED, log
    assert collect(config.store(), handle.job_id, report.status) == {
        "is_dir": True,
        "all": [1, 2, 3],
    }
    assert any("/resolve/" in r.path for r in hf_hub.requests)
    assert not (Path(config.bucket_name) / "default" / "data-markers").exists()  # nothing cached


def test_hf_dataset_all_splits(tmp_path, hf_hub):
    hf_hub.add_dataset("org/tiny", {"train": {"x": [1]}, "test": {"x": [7, 8]}})
    report, config, handle, log = run_local(tmp_path, rows_in, Data("hf://org/tiny"))
    assert report.status is JobStatus.SUCCEEDED, log
    value = collect(config.store(), handle.job_id, report.status)
    assert value == {"is_dir": True, "train": [1], "test": [7, 8]}


def test_hf_refuses_fuse_and_bad_uris_before_any_upload(tmp_path):
    store = tmp_path / "store"
    config = KineticConfig(backend="local", root=str(store))
    backend = LocalBackend(config.bucket_name)
    for data, match in (
        (Data("hf://org/tiny", fuse=True), "fuse=True is not supported for hf://"),
        (Data("hf://org/tiny?splits=train"), "unknown query key 'splits'"),
    ):
        with pytest.raises(ValueError, match=match):
            submit_job(JobRequest(func=len, args=(data,)), config, backend)
    assert not store.exists() or not any(store.rglob("*"))


def test_missing_dataset_fails_the_job_in_data_resolve(tmp_path, hf_hub):
    report, config, handle, log = run_local(tmp_path, rows_in, Data("hf://org/absent"))
    assert report.status is JobStatus.FAILED
    with pytest.raises(Exception, match="org/absent") as info:
        collect(config.store(), handle.job_id, report.status)
    assert "Failed during kinetic phase: data resolve" in "\n".join(info.value.__notes__)


# ---- the chained example DAG ----------------------------------------------------------


def test_train_evaluate_chained_through_output_dir(load_dag, airflow_home):
    dag = load_dag("train_evaluate.py", "train_evaluate")
    dr = dag.test(logical_date=pendulum.datetime(2026, 11, 21, tz="UTC"))
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", states
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    out = x[("train", "output_dir")]
    assert out.startswith("file://") and out.endswith("/train/-1")
    metrics = x[("evaluate", "return_value")]
    assert metrics["model_files"] == ["model.json"] and metrics["rows"] == 100
    assert metrics["mse"] < 0.01 and x[("report", "return_value")] == metrics
    # evaluate's Data was train's output dir, exactly: its content is in the data cache.
    model_dir = Path(out[len("file://") :])
    model = json.loads((model_dir / "model.json").read_text())
    assert model == x[("train", "return_value")]
    markers = airflow_home / "kinetic" / "default" / "data-markers"
    assert (markers / content_hash_of(str(model_dir))).exists()
