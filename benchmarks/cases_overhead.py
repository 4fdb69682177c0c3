"""Job overhead case (issue 12, goal 4): what a Kinetic task adds to a plain ``@task``.

On the local backend, in a private ``AIRFLOW_HOME`` (a temp dir, removed afterwards),
``overhead_child.py`` times with ``dag.test()``: a plain ``@task`` returning 1 (the
baseline), ``KineticRunOperator`` of a function returning 1, sync and deferrable
(goal: at most ``MAX_EXTRA_S`` above the baseline), and a deferrable job of ~7 s, long
enough to really defer, against Airflow's own deferral of 7 s (``DateTimeSensorAsync``
of the standard provider, its target 7 s after the task starts): what each adds to
7 s, ours at most ``MAX_DEFER_RATIO`` times Airflow's.  Best of ``repeat`` runs after a
warm-up.  Nothing is compared with kinetic here: kinetic has no Airflow tasks.

Under ``dag.test()`` the trigger runs inline in the task's own process once the task
has deferred, so no executor reports the deferring exit late and the trigger holds
nothing (``triggers.settle``); with an executor and a triggerer (``airflow
standalone``) a job whose end comes within the hold still waits it out.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from table import Row

HERE = Path(__file__).resolve().parent
MAX_EXTRA_S = 1.5
#: A deferred 7 s job's overhead (its time minus 7 s) over Airflow's own 7 s deferral's.
MAX_DEFER_RATIO = 1.2
#: The deferred pair's length, seconds (``overhead_dags.seven_seconds``).
DEFERRED_S = 7.0
#: The sweep row's goal, in poll intervals.
SWEEP_MAX_POLLS = 2.0
#: (our DAG, its baseline DAG, case, the most ours may add; ``None``: an info row)
CASES = (
    ("overhead_sync", "overhead_plain", "job overhead: trivial function, sync, local",
     MAX_EXTRA_S),
    ("overhead_deferrable", "overhead_plain",
     "job overhead: trivial function, deferrable, local", MAX_EXTRA_S),
    ("overhead_deferred_7s", "overhead_plain_7s",
     "job overhead: 7 s job, deferrable (it defers), local", None),
)  # fmt: skip
NOTES = {
    "overhead_sync": "task instance durations under dag.test(), best of {n} after a warm-up",
    "overhead_deferrable": "collected before deferring (DEFER_GRACE_S {grace:g} s)",
    "overhead_deferred_7s": "baseline: a plain @task sleeping 7 s; the job defers after "
    "{grace:g} s; under dag.test() its trigger runs in the deferring process and holds "
    "nothing (with an executor it holds the event until {settle:g} s after the deferral, "
    "triggers.settle)",
}


def private_env(home: Path) -> dict[str, str]:
    """This process's environment minus every Airflow setting, plus a fresh home: the
    benchmark must not read or write the caller's Airflow (or a test session's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__KINETIC__RESULT_SIGNING_KEY": secrets.token_hex(32),
        }
    )
    return env


def measure(repeat: int, timeout_s: float = 900.0) -> dict[str, dict[str, list]]:
    """Migrate a private metadata DB, run the child; its JSON (durations, states)."""
    with tempfile.TemporaryDirectory(prefix="kinetic-bench-home-") as home_s:
        home = Path(home_s)
        (home / "dags").mkdir()
        shutil.copy(HERE / "overhead_dags.py", home / "dags" / "overhead_dags.py")
        env = private_env(home)
        run = {"env": env, "capture_output": True, "text": True, "timeout": timeout_s}
        migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], **run)
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stderr[-3000:]}")
        child = subprocess.run(
            [sys.executable, str(HERE / "overhead_child.py"), str(repeat)], **run
        )
        if child.returncode != 0:
            raise RuntimeError(f"overhead_child.py failed:\n{child.stderr[-3000:]}")
        return json.loads(child.stdout.strip().splitlines()[-1])


def overhead(repeat: int) -> list[Row]:
    """One row per timed Kinetic task against its plain ``@task``."""
    from airflow_provider_kinetic.operators.common import DEFER_GRACE_S
    from airflow_provider_kinetic.triggers.settle import settle_s

    found = measure(repeat)
    rows = []
    for dag_id, base_id, case, limit in CASES:
        ours, base = found[dag_id], found[base_id]
        note = NOTES[dag_id].format(n=repeat, grace=DEFER_GRACE_S, settle=settle_s())
        ok = all(s == "success" for s in ours["states"] + base["states"])
        if not ok:
            note += f"; task states {ours['states']}, baseline {base['states']}"
        base_name = "plain @task" + (" 7 s" if base_id.endswith("7s") else "")
        t_base, t_ours = min(base["durations"]), min(ours["durations"])
        rows.append(Row.added(case, base_name, t_base, t_ours, limit, note=note, ok=ok))
    best = {d: min(found[d]["durations"]) for d in ("overhead_sync", "overhead_plain")}
    sync_extra = best["overhead_sync"] - best["overhead_plain"]
    pair = (found["overhead_deferred_7s"], found["overhead_airflow_defer_7s"])
    rows.append(deferral_row(*pair, sync_extra))
    rows.append(deferral_split_row(*pair, sync_extra))
    rows.append(sweep_row(found["sweep"]))
    return rows


def deferral_row(ours: dict, airflow: dict, sync_extra: float) -> Row:
    """What a deferred 7 s Kinetic job adds to 7 s, over what Airflow's own deferral of
    7 s adds (best run of each, interleaved in one run), with where ours goes: before
    the function started and after it ended (the function's own times), and how much
    of it any Kinetic job pays without deferring (``sync_extra``, the trivial sync
    row's: submit, the runner's start, collecting)."""
    best = min(range(len(ours["durations"])), key=ours["durations"].__getitem__)
    t_ours, t_af = ours["durations"][best], min(airflow["durations"])
    extra, extra_af = t_ours - DEFERRED_S, t_af - DEFERRED_S
    ok = all(s == "success" for s in ours["states"] + airflow["states"])
    times = (ours.get("phases") or [{}])[best]
    note = (
        "under dag.test(): DateTimeSensorAsync (standard provider), its target_time "
        "rendered 7 s after the task starts, defers, DateTimeTrigger fires (it checks "
        "once a second), the task resumes"
    )
    if times:
        note += (
            f"; ours: {times['before']:.2f} s from the task's start to the function's "
            f"(submit, the runner's start), {times['after']:.2f} s from the function's end "
            "to the task's (the trigger sees the exit code, its event, the resumed task "
            "collects), the rest in the function and its runner"
        )
    note += (
        f"; a trivial sync job adds {sync_extra:.3f} s in the same run (no deferral), "
        f"so deferring adds {extra - sync_extra:+.3f} s to what any job costs"
    )
    if not ok:
        note += f"; task states {ours['states']}, Airflow's {airflow['states']}"
    ratio = extra / extra_af if extra_af > 0 else float("inf")
    return Row(
        "deferral overhead: 7 s job deferred vs Airflow's own 7 s deferral, local",
        f"DateTimeSensorAsync 7 s {t_af:.3f} s (+{extra_af:.3f} s)",
        f"{t_ours:.3f} s (+{extra:.3f} s, {ratio:.2f}x Airflow's)",
        None,
        f"<= {MAX_DEFER_RATIO:g}x Airflow's",
        ok and ratio <= MAX_DEFER_RATIO,
        note=note,
    )


def deferral_split_row(ours: dict, airflow: dict, sync_extra: float) -> Row:
    """(info) The deferral row's overhead less what any Kinetic job costs without
    deferring (the trivial sync job's, same run: submit, the runner's process start,
    collecting): what deferring itself adds, beside Airflow's whole deferral."""
    t_ours, t_af = min(ours["durations"]), min(airflow["durations"])
    extra, extra_af = t_ours - DEFERRED_S, t_af - DEFERRED_S
    deferring = extra - sync_extra
    ratio = deferring / extra_af if extra_af > 0 else float("inf")
    return Row(
        "deferral overhead less a job's own start and collect, local",
        f"DateTimeSensorAsync 7 s +{extra_af:.3f} s",
        f"{deferring:+.3f} s ({ratio:.2f}x Airflow's)",
        None,
        "(info)",
        None,
        note=f"ours: the deferred 7 s job's +{extra:.3f} s less the trivial sync job's "
        f"+{sync_extra:.3f} s (no deferral), both best of their runs; what remains is "
        "the defer, the trigger noticing the runner's exit and the resume",
    )


def sweep_row(found: dict) -> Row:
    """A deferrable sweep's slots: from a child ending to the next one starting in its
    slot (the function's own start, so the runner's start is in it), against the
    poll interval: goal under ``SWEEP_MAX_POLLS`` polls (issue 26: 9-20 s, when each
    finished child resumed the worker)."""
    gaps, poll = found["gaps"], found["poll_s"]
    worst = max(gaps) if gaps else float("inf")
    ok = found["state"] == "success" and bool(gaps)
    return Row(
        "deferrable sweep: a freed slot until the next child starts, local",
        f"poll interval {poll:g} s",
        f"max {worst:.2f} s (median {sorted(gaps)[len(gaps) // 2]:.2f} s)" if gaps else "-",
        None,
        f"< {SWEEP_MAX_POLLS:g} polls",
        ok and worst < SWEEP_MAX_POLLS * poll,
        note=f"{len(gaps)} slot handovers of one 6-input sweep, max_concurrent 2, under "
        "dag.test() (the trigger launches them while the task is deferred)"
        + ("" if ok else f"; run {found['state']}"),
    )
