"""The checkpoint example (``dags_examples/checkpoint_resume.py``) under ``dag.test()``:
uninterrupted, and preempted mid-run on the local backend, where the second attempt
starts from the last saved step and the work done is one run's plus at most one sync
interval's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pendulum
import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import task_checkpoints_key
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures import preempt_midrun
from tests.fixtures.airflow_env import REPO, task_states, xcoms
from tests.fixtures.local_conn import set_conn

LOGICAL = pendulum.datetime(2026, 11, 23, tz="UTC")
EXAMPLE = REPO / "dags_examples" / "checkpoint_resume.py"


def example_train():
    """The example's ``train`` (its defaults are what the DAG runs)."""
    spec = importlib.util.spec_from_file_location("checkpoint_resume_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.train


def defaults() -> dict:
    import inspect

    params = inspect.signature(example_train()).parameters
    return {name: p.default for name, p in params.items()}


def uninterrupted_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What the example ends with when nothing interrupts it (run here, quickly)."""
    folder = tmp_path / "reference"
    folder.mkdir()
    monkeypatch.setenv("KINETIC_CHECKPOINT_DIR", str(folder))
    monkeypatch.setenv("KINETIC_ATTEMPT", "1")
    return example_train()(step_s=0)["w"]


def run_example(load_dag) -> tuple[dict, dict]:  # noqa: ANN001
    dr = load_dag("checkpoint_resume.py", "checkpoint_resume").test(logical_date=LOGICAL)
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", states
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    identity = {"dag_id": dr.dag_id, "run_id": dr.run_id, "task_id": "train", "map_index": -1}
    return x, identity


def steps(log: str, attempt: int, what: str = "step") -> list[int]:
    return [int(n) for n in re.findall(rf"^attempt {attempt} {what} (\d+)$", log, re.M)]


def test_uninterrupted_the_example_runs_once_from_the_start(load_dag, tmp_path, monkeypatch):
    x, _ = run_example(load_dag)
    result = x[("check", "return_value")]
    assert (result["attempt"], result["resumed_from"]) == (1, 0)
    assert np.allclose(result["w"], uninterrupted_weights(tmp_path, monkeypatch), atol=0)


@pytest.fixture
def midrun(monkeypatch, tmp_path) -> Path:
    """``kinetic_default`` -> the ``preempt_midrun`` backend (the example's connection)."""
    preempt_midrun.register()
    root = tmp_path / "kinetic"
    set_conn(monkeypatch, "kinetic_default", {"backend": "preempt_midrun", "root": str(root)})
    yield root
    preempt_midrun.unregister()


def test_preempted_mid_run_the_example_resumes_from_its_last_save(
    load_dag, midrun, tmp_path, monkeypatch
):
    x, identity = run_example(load_dag)
    result = x[("train", "return_value")]
    store = LocalStore(str(midrun))
    first = preempt_midrun.first_job(str(midrun))
    second = JobHandle.from_dict(x[("train", "kinetic_job")]).job_id
    assert second != first
    log1, log2 = history.read_log(store, first), history.read_log(store, second)
    assert log1 and log2
    ran1, saved1, ran2 = steps(log1, 1), steps(log1, 1, "saved step"), steps(log2, 2)
    total, every = defaults()["steps"], defaults()["every"]
    # The platform preempted it mid-run, once some periodic syncs had published.
    assert preempted_midway(ran1, saved1, total)
    assert "SIGTERM: checkpoints saved" in log1
    # The second attempt knew it was one, and started after the last step saved.
    assert result["attempt"] == 2
    assert f"attempt 2: resuming after step {result['resumed_from']}" in log2
    assert saved1[-1] <= result["resumed_from"] <= ran1[-1]
    assert ran2 == list(range(result["resumed_from"] + 1, total + 1))
    # Work done: one run's, plus at most one sync interval's worth of steps (here, with
    # the save on SIGTERM, at most the steps since the function's own last save).
    per_sync = preempt_midrun.SYNC_S / defaults()["step_s"]
    assert len(ran1) + len(ran2) <= total + per_sync
    assert len(ran1) - result["resumed_from"] <= every
    # Deterministic training: resumed, it ends exactly where an uninterrupted run does.
    assert np.allclose(result["w"], uninterrupted_weights(tmp_path, monkeypatch), atol=0)
    # The task succeeded and its cleanup policy (on_success) deletes artifacts: its
    # checkpoints went with them (nothing will resume from them).
    assert store.list(task_checkpoints_key(identity)) == []


def preempted_midway(ran: list[int], saved: list[int], total: int) -> bool:
    """Attempt 1 ran steps 1..k in order for some 0 < k < total and saved some."""
    return bool(saved) and ran == list(range(1, len(ran) + 1)) and 0 < len(ran) < total
