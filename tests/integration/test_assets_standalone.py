"""The asset example pair under a real ``airflow standalone``: ``asset_train`` (with
``output_key``) adds one event a run to its task's asset, through the alias
``kinetic:asset_train/train``; ``asset_evaluate``, scheduled on that asset
(``task_asset("asset_train", "train")``), evaluates each dir it is told about
(``dags_examples/asset_*.py``).  Ten and more training runs leave two assets: the
task's stable asset and the key's, both declared when the file is parsed (issue 42:
before, every run's dir was an asset of its own).

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
    """Every training run is evaluated once, on its own date's model.  Events of the
    one task asset that arrive while the scheduler makes an evaluation run for an
    earlier one wait for the next evaluation run (Airflow 3.3.2 deletes the asset's
    queue row, not just the events it consumed): so the check comes after a last
    training run made alone, whose evaluation takes every event still waiting."""
    examples = REPO / "dags_examples"
    env = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True"}  # asset runs need it
    with run_standalone(
        tmp_path, examples / "asset_train.py", extra_dag_files=[examples / "asset_evaluate.py"],
        env=env,
    ) as s:  # fmt: skip
        s.unpause(EVALUATE)
        s.unpause(TRAIN)  # one scheduled run (catchup=False) may start now
        s.trigger(TRAIN, "manual_run")
        s.wait_for("the first training runs", lambda: _training_done(s, 1), RUN_DEADLINE_S)
        # Nine more dates, triggered at once (ten training runs or more in all; the
        # manual run's logical date is the fixture's, 2026-11-15).
        dates = [f"2026-11-{day:02d}" for day in range(1, 10)]
        for day in dates:
            resp = s.api(
                "POST",
                f"/dags/{TRAIN}/dagRuns",
                json={"dag_run_id": f"day_{day}", "logical_date": f"{day}T00:00:00Z"},
            )
            assert resp.status_code == 200, resp.text
        s.wait_for("the dated runs", lambda: _training_done(s, len(dates) + 1), RUN_DEADLINE_S)
        made = len(_runs(s, TRAIN))
        last = {"dag_run_id": "last_run", "logical_date": "2026-11-20T00:00:00Z"}
        assert (
            s.api("POST", f"/dags/{TRAIN}/dagRuns", json=last).status_code == 200
        )  # alone: its evaluation takes whatever waits
        every = _check_every_training_run_evaluated_once(s, made + 1)
        dated = {r["logical_date"][:10] for r in _runs(s, TRAIN) if r["dag_run_id"] in every}
        assert dated >= set(dates) and len(every) >= 11
        # Runs add events, never assets: the task's and the key's, nothing per run (the
        # database's own count: the API lists only assets a DAG declares).
        made_by_train = _assets_with_events_of(s, TRAIN)
        assert sorted(made_by_train) == [
            "kinetic://models/asset_train",
            "x-kinetic-task://asset_train/train",
        ], made_by_train
        # One event a run on the task asset (the alias's: Airflow adds none of its own).
        assert made_by_train["x-kinetic-task://asset_train/train"] == len(every)
        # The key's asset has an event for each run that moved the key, and only those
        # (older dates than the key's keep their versions aside: newest_logical_date).
        (key,) = [a for a in s.json("/assets?limit=100")["assets"] if a["uri"].startswith("kin")]
        key_events = s.json(f"/assets/events?asset_id={key['id']}&limit=100")["asset_events"]
        rows = {r: _xcom(s, TRAIN, r, "train", "kinetic_output_key") for r in every}
        moved = {r for r, row in rows.items() if row["new"] and not row.get("aside")}
        assert sorted(e["source_run_id"] for e in key_events) == sorted(moved)
        assert all(e["extra"]["version"] == rows[e["source_run_id"]]["version"] for e in key_events)
        _report_end_steps(s, sorted(every))


def _assets_with_events_of(s: Standalone, dag_id: str) -> dict[str, int]:
    """URI -> events of every asset that ``dag_id``'s runs added events to, read from
    the standalone's SQLite database (read-only)."""
    import sqlite3

    db = sqlite3.connect(f"file:{s.home / 'airflow.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute(
            "SELECT a.uri, COUNT(e.id) FROM asset a JOIN asset_event e ON e.asset_id = a.id"
            " WHERE e.source_dag_id = ? GROUP BY a.uri",
            (dag_id,),
        ).fetchall()
        print("assets in the database:", db.execute("SELECT COUNT(*) FROM asset").fetchone()[0])
    finally:
        db.close()
    return dict(rows)


def _report_end_steps(s: Standalone, run_ids: list[str]) -> None:
    """Prints, per training run, the seconds from its job's end (the log line that
    says it SUCCEEDED) to the task log's last line: measured, not asserted (a
    wall-clock bound would fail on a loaded machine)."""
    import datetime as dt

    def at(entry: dict[str, Any]) -> dt.datetime:
        return dt.datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00"))

    steps = []
    for run_id in run_ids:
        entries = [e for e in s.task_log(TRAIN, run_id, "train") if e.get("timestamp")]
        ended = [e for e in entries if "SUCCEEDED" in str(e.get("event", ""))]
        if ended:
            steps.append((run_id, (at(entries[-1]) - at(ended[-1])).total_seconds()))
    print("output_key task, job end -> task end (s):", steps)
    assert len(steps) == len(run_ids), "a training run's log never said its job SUCCEEDED"
