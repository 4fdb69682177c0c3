"""The asset example pair under a real ``airflow standalone``: ``asset_train`` emits its
model dir through the alias ``kinetic:asset_train/train``; ``asset_evaluate``, scheduled
on that alias, evaluates each dir it is told about (``dags_examples/asset_*.py``).

Unpausing ``asset_train`` (``@daily``, ``catchup=False``) also makes one scheduled run,
and Airflow may hand one evaluation run the events of several training runs that
ended close together; so the checks are per training run: its output dir is evaluated
exactly once, by an evaluation of its own date's model.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from tests.fixtures.standalone import (
    REPO,
    RUN_DEADLINE_S,
    Standalone,
    backfill,
    run_standalone,
)

TRAIN, EVALUATE = "asset_train", "asset_evaluate"
FINISHED = ("success", "failed")


def _q(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")


def _xcom(s: Standalone, dag_id: str, run_id: str, task_id: str, key: str, map_index: int = -1):  # noqa: ANN202
    path = f"/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances/{task_id}/xcomEntries/{key}"
    params: dict[str, Any] = {"deserialize": True, "stringify": False}
    if map_index >= 0:
        params["map_index"] = map_index
    resp = s.api("GET", path, params=params)
    assert resp.status_code == 200, f"{path}: {resp.text}"
    return resp.json()["value"]


def _runs(s: Standalone, dag_id: str) -> list[dict[str, Any]]:
    return s.json(f"/dags/{dag_id}/dagRuns")["dag_runs"]


def _training_done(s: Standalone, at_least: int) -> list[dict[str, Any]] | None:
    runs = _runs(s, TRAIN)
    if len(runs) >= at_least and all(r["state"] in FINISHED for r in runs):
        return runs
    return None


def _evaluations(s: Standalone) -> dict[str, list[dict[str, Any]]]:
    """source run id -> the evaluations of its model, over every finished eval run."""
    found: dict[str, list[dict[str, Any]]] = {}
    for run in _runs(s, EVALUATE):
        if run["state"] not in FINISHED:
            continue
        assert run["state"] == "success", run
        models = _xcom(s, EVALUATE, run["dag_run_id"], "trained_models", "return_value")
        for i, model in enumerate(models):
            value = _xcom(s, EVALUATE, run["dag_run_id"], "evaluate", "return_value", i)
            found.setdefault(value["source_run_id"], []).append({**value, **model})
    return found


def _check_every_training_run_evaluated_once(s: Standalone, at_least: int) -> set[str]:
    runs = s.wait_for(
        "training runs to finish",
        lambda: _training_done(s, at_least),
        RUN_DEADLINE_S,
    )
    assert all(r["state"] == "success" for r in runs), runs
    wanted = {r["dag_run_id"]: r for r in runs}

    def covered() -> dict[str, list[dict[str, Any]]] | None:
        found = _evaluations(s)
        pending = any(r["state"] not in FINISHED for r in _runs(s, EVALUATE))
        return found if set(found) >= set(wanted) and not pending else None

    found = s.wait_for("an evaluation of every training run", covered, RUN_DEADLINE_S)
    assert set(found) == set(wanted), (sorted(found), sorted(wanted))
    for run_id, run in wanted.items():
        (evaluation,) = found[run_id]  # exactly once
        out = _xcom(s, TRAIN, run_id, "train", "output_dir")
        assert evaluation["model_dir"] == out
        assert evaluation["trained_ds"] == run["logical_date"][:10]
        assert evaluation["mse"] < 0.01
    assert len(_runs(s, EVALUATE)) <= len(wanted)  # never a run without an event
    return set(wanted)


def test_training_events_schedule_evaluations_once_each(tmp_path: Path):
    examples = REPO / "dags_examples"
    env = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True"}  # asset runs need it
    with run_standalone(
        tmp_path, examples / "asset_train.py", extra_dag_files=[examples / "asset_evaluate.py"],
        env=env,
    ) as s:  # fmt: skip
        s.unpause(EVALUATE)
        s.unpause(TRAIN)  # one scheduled run (catchup=False) may start now
        s.trigger(TRAIN, "manual_run")
        first = _check_every_training_run_evaluated_once(s, 1)
        assert "manual_run" in first

        # A backfill of three dates: three more training runs, three more evaluations,
        # each on its own date's model dir.
        dates = ["2026-11-10", "2026-11-11", "2026-11-12"]
        done = backfill(s.home, int(s.client.base_url.port), TRAIN, dates[0], dates[-1], env)
        assert done.returncode == 0, done.stdout + done.stderr
        every = _check_every_training_run_evaluated_once(s, len(first) + 3)
        backfilled = {
            r["logical_date"][:10] for r in _runs(s, TRAIN) if r["dag_run_id"] not in first
        }
        assert backfilled == set(dates) and len(every - first) == 3
