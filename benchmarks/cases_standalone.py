"""Deferral under ``airflow standalone`` (issue 46): what a deferred Kinetic job's task
takes beyond its job's length, against Airflow's own deferral of the same length.

One standalone (a private home, removed afterwards), ``standalone_dags.py`` in its DAGs
folder.  Per round, one run at a time, interleaved: for 7 s and 20 s, a deferred job
whose trigger ends the task (nothing runs on a worker after it), the same job resumed
on a worker (its asset event: the trigger's event is held, ``triggers.settle``, as
every deferred job's was before), and ``DateTimeSensorAsync``.  Each task's time is its
task instance's end minus its start as Airflow records them (REST API), less the
length; the median of the rounds.  Goal: a job whose trigger ends its task at most
``MAX_LATER_S`` later than Airflow's deferral of the same length.

Not in ``--quick`` (a standalone's boot alone is a minute on two cores): ``--only
standalone``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from table import Row

HERE = Path(__file__).resolve().parent
#: At most this much later than Airflow's own deferral of the same length, seconds.
MAX_LATER_S = 1.0
#: The output_key task's step from its job's end to its own end, seconds (issue 42).
MAX_END_STEP_S = 1.0
#: The DAGs of that step: with output_key, and the same task without it.
END_STEP_DAGS = ("bench_end_step_key", "bench_end_step_plain")
#: (DAG prefix, what it is)
KINDS = (
    ("bench_trigger_ends", "ours, the trigger ends the task"),
    ("bench_worker_ends", "ours, resumed on a worker (held event)"),
    ("bench_airflow", "DateTimeSensorAsync"),
)


def _at(stamp: object) -> datetime:
    """A time as Airflow's REST API spells it (``...Z``)."""
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def _seconds(ti: dict) -> float:
    return (_at(ti["end_date"]) - _at(ti["start_date"])).total_seconds()


def _resumed(s: object, dag_id: str, run_id: str) -> bool:
    """Whether a worker resumed the task after its trigger (the task log says so)."""
    entries = s.task_log(dag_id, run_id, "job")  # type: ignore[attr-defined]
    return any("resumed: trigger said" in str(e.get("event")) for e in entries)


def measure(rounds: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Seconds beyond the length, per DAG id, one value per round; and per DAG id how
    many of its runs a worker resumed."""
    sys.path.insert(0, str(HERE.parent))
    from standalone_dags import LENGTHS

    from tests.fixtures.standalone import run_standalone

    found: dict[str, list[float]] = {}
    resumed: dict[str, int] = {}
    with (
        tempfile.TemporaryDirectory(prefix="kinetic-bench-standalone-") as tmp,
        run_standalone(Path(tmp), HERE / "standalone_dags.py") as s,
    ):
        dags = [(f"{kind}_{n}s", n) for n in LENGTHS for kind, _ in KINDS]
        for dag_id in [d for d, _ in dags] + list(END_STEP_DAGS):
            s.unpause(dag_id)
        for r in range(rounds):
            run_id = f"round_{r}"
            for dag_id, length in dags:
                s.trigger(dag_id, run_id, logical_date=None)
                state = s.wait_finished(dag_id, run_id)
                ti = s.json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/job")
                if state != "success" or ti["state"] != "success":
                    raise RuntimeError(f"{dag_id} {run_id}: {state}, task {ti['state']}")
                found.setdefault(dag_id, []).append(_seconds(ti) - length)
                if not dag_id.startswith("bench_airflow"):
                    resumed[dag_id] = resumed.get(dag_id, 0) + _resumed(s, dag_id, run_id)
            for dag_id in END_STEP_DAGS:
                s.trigger(dag_id, run_id, logical_date=None)
                if s.wait_finished(dag_id, run_id) != "success":
                    raise RuntimeError(f"{dag_id} {run_id} did not succeed")
                found.setdefault(dag_id, []).append(_end_step(s, dag_id, run_id))
            print(f"standalone round {r + 1}/{rounds} done", flush=True)
    return found, resumed


def _end_step(s: object, dag_id: str, run_id: str) -> float:
    """Seconds from the job's end (the task log's line that says it SUCCEEDED, stamped
    when the job wrote it) to the task instance's end as Airflow records it."""
    entries = s.task_log(dag_id, run_id, "job")  # type: ignore[attr-defined]
    ended = [e for e in entries if "SUCCEEDED" in str(e.get("event")) and e.get("timestamp")]
    if not ended:
        raise RuntimeError(f"{dag_id} {run_id}: no job-end line in the task log")
    ti = s.json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/job")  # type: ignore[attr-defined]
    return (_at(ti["end_date"]) - _at(ended[-1]["timestamp"])).total_seconds()


def end_step_rows(found: dict[str, list[float]], rounds: int) -> list[Row]:
    """The output_key task's step from job end to task end (goal: under a second),
    beside the same task without output_key."""
    key, plain = (statistics.median(found[d]) for d in END_STEP_DAGS)
    every = "; ".join(f"{d}: " + ", ".join(f"{v:.2f}" for v in found[d]) for d in END_STEP_DAGS)
    return [
        Row(
            "output_key task under standalone: job end -> task end",
            f"no output_key {plain:.2f} s",
            f"{key:.2f} s",
            None,
            f"< {MAX_END_STEP_S:g} s",
            key < MAX_END_STEP_S,
            note=f"median of {rounds} runs each (the key's put, its asset event, the "
            f"task's end), the google provider installed; every run: {every}",
        )
    ]


def deferral(rounds: int) -> list[Row]:
    """Per length: the trigger-ended job against Airflow's deferral (goal), and the
    worker-resumed job against it (info: the path every deferred job took before)."""
    from standalone_dags import LENGTHS

    found, resumed = measure(rounds)
    rows = []
    for n in LENGTHS:
        airflow = statistics.median(found[f"bench_airflow_{n}s"])
        for kind, what in KINDS[:2]:
            ours = statistics.median(found[f"{kind}_{n}s"])
            goal = kind == "bench_trigger_ends"
            rows.append(
                Row(
                    f"deferred {n} s job under standalone: {what}",
                    f"DateTimeSensorAsync {n} s +{airflow:.2f} s",
                    f"+{ours:.2f} s ({ours - airflow:+.2f} s)",
                    None,
                    f"<= +{MAX_LATER_S:g} s beyond Airflow's" if goal else "(info)",
                    (ours - airflow <= MAX_LATER_S) if goal else None,
                    note=f"task instance end minus start less {n} s, median of {rounds} "
                    "interleaved rounds, one run at a time; every run: "
                    + ", ".join(f"{v:+.2f}" for v in found[f"{kind}_{n}s"])
                    + "; Airflow's: "
                    + ", ".join(f"{v:+.2f}" for v in found[f"bench_airflow_{n}s"])
                    + f"; runs a worker resumed: {resumed.get(f'{kind}_{n}s', 0)} of {rounds}",
                )
            )
    return rows + end_step_rows(found, rounds)
