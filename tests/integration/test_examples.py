"""The example DAGs run end to end on the local backend under ``dag.test()``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pendulum

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.airflow_env import task_states, xcoms

LOGICAL = pendulum.datetime(2026, 11, 19, tz="UTC")


def run(load_dag, filename: str, dag_id: str):  # noqa: ANN001, ANN202
    dr = load_dag(filename, dag_id).test(logical_date=LOGICAL)
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", states
    return {(t, k): v for (t, k, _), v in xcoms(dr).items()}


def test_jax_tpu_example_trains_on_this_cpu_and_writes_a_checkpoint(load_dag):
    x = run(load_dag, "jax_tpu_train.py", "jax_tpu_train")
    metrics = x[("train", "return_value")]
    assert metrics["devices"] == ["cpu"] and metrics["final_loss"] < 0.01
    assert abs(metrics["w"][0] - 3.0) < 0.05 and abs(metrics["w"][1] + 2.0) < 0.05
    handle = x[("train", "kinetic_job")]
    assert handle["accelerator"] == "tpu-v5e-8"
    # The local backend ran the TPU job on this CPU (its history says which job and
    # where; the job's local state dir went once its value was delivered).
    store = LocalStore(handle["bucket_name"])
    entry = history.read(store, handle["job_id"])
    assert (entry["backend"], entry["accelerator"], entry["state"]) == (
        "local",
        "tpu-v5e-8",
        "SUCCEEDED",
    )
    out_dir = Path(x[("check", "return_value")][len("file://") :])
    ckpt = np.load(io.BytesIO((out_dir / "checkpoint.npz").read_bytes()))
    assert np.allclose(ckpt["w"], metrics["w"], atol=1e-6)
    assert json.loads((out_dir / "metrics.json").read_text()) == metrics


def test_lr_sweep_picks_the_best_child(load_dag):
    x = run(load_dag, "lr_sweep.py", "lr_sweep")
    results = x[("sweep", "return_value")]
    assert [r["lr"] for r in results] == [0.001, 0.01, 0.1, 0.5]  # input order
    best = x[("pick_best", "return_value")]
    assert best == min(results, key=lambda r: r["loss"]) and best["lr"] == 0.5
    assert x[("sweep", "kinetic_batch")]["counts"]["succeeded"] == 4


def test_keys_example_publishes_by_output_key_and_scores_by_key_with_broadcast(load_dag, capfd):
    """train -> output_key -> a broadcast batch that reads the model by key."""
    import re

    from airflow_provider_kinetic.core.keys.keystore import KeyStore

    x = run(load_dag, "keys_publish_score.py", "keys_publish_score")
    out = "".join(capfd.readouterr())
    published = x[("train", "kinetic_output_key")]
    assert published["key"] == "examples/churn-model"
    store = LocalStore(x[("train", "kinetic_job")]["bucket_name"])
    state = KeyStore(store).state("examples/churn-model")
    assert state.current.version == published["version"]
    assert (
        state.current.by["dag_id"] == "keys_publish_score"
        and state.current.by["task_id"] == "train"
    )
    # The batch read the version train published, pinned for the run.
    (pin,) = x[("score", "kinetic_keys")]
    assert (pin["key"], pin["version"]) == ("examples/churn-model", published["version"])
    results = x[("score", "return_value")]
    model = x[("train", "return_value")]
    assert [r["model_ds"] for r in results] == [LOGICAL.to_date_string()] * 3
    assert abs(model["w"] - 1.5) < 0.05 and abs(model["b"] + 0.25) < 0.05
    assert abs(results[0]["predictions"][0] - (model["w"] * 0.5 + model["b"])) < 1e-3
    assert x[("report", "return_value")] == 6
    # broadcast=True: each child joined the batch's tree and verified its copy.  These
    # children end in a blink, so a later one may find its parent gone and read the
    # store (tests/integration/core/keys/peer/test_peers_jobs.py holds children together to show the
    # tree itself); the first child always reads the store.
    came = re.findall(r"data [0-9a-f]{12}: \d+ file\(s\) by broadcast from (\S+), verified", out)
    assert len(came) == 3 and "store" in [c.rstrip(",") for c in came], came
