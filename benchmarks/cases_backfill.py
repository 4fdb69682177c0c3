"""Backfills that do only what changed (issue 41) under ``airflow standalone``: a 30-date
backfill of a daily ``train`` (``backfill_dags.py``), each date's value checked by a
plain task that recomputes it from the date's files.

One standalone (a private home, removed afterwards).  In order, each pass one
``airflow backfill create`` over the 30 dates (a later pass with ``--reprocess-behavior
completed``: Airflow clears each date's run in the CLI's one transaction; its REST
backfill API refuses SQLite while the scheduler writes, and 30 REST clears time the
SQLite API server out):

1. both DAGs backfilled over the 30 dates (the cached DAG's results go to the cache);
2. five dates' files change; both DAGs backfilled again: the cached DAG runs a job
   for the five dates only (goal: exactly five) and takes the other 25 values from
   the cache, against the baseline DAG's 30 jobs;
3. the cached DAG backfilled once more: no job at all (goal: none).

Every run's ``check`` must succeed (each value right for its date).  Jobs run are
counted in the store's history (entries of kind ``job`` of that DAG), hits in each
``train``'s ``kinetic_cache`` XCom; time is the backfill's wall time.

Not in ``--quick`` (a standalone, and four backfills of 30 runs): ``--only backfill``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from table import Row

HERE = Path(__file__).resolve().parent
#: Dates whose files change before the second backfill (day offsets).
CHANGED = (3, 9, 14, 22, 27)


def _dates() -> list[str]:
    sys.path.insert(0, str(HERE))
    from backfill_dags import DAYS, START

    return [START.add(days=i).to_date_string() for i in range(DAYS)]


def write_data(root: Path, changed: tuple[int, ...] = ()) -> None:
    """Each date's directory: a few files of numbers; ``changed`` dates get one more."""
    for i, ds in enumerate(_dates()):
        folder = root / ds
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(3):
            (folder / f"part-{f}.txt").write_text(" ".join(str(i * 10 + f + k) for k in range(5)))
        if i in changed:
            (folder / "late.txt").write_text(str(1000 + i))


def _jobs(home: Path, dag_id: str) -> int:
    """Jobs the DAG has run so far: its history entries of kind job."""
    from airflow_provider_kinetic.core.jobs import history
    from airflow_provider_kinetic.core.storage import LocalStore

    store = LocalStore(str(home / "kinetic"))
    keep = lambda e: e.get("dag_id") == dag_id and e.get("kind") == "job"  # noqa: E731
    return len(history.entries(store, keep))


def backfill(s: Any, dag_id: str, data_root: Path, again: bool = False) -> dict[str, Any]:
    """One ``airflow backfill create`` over every date (``--reprocess-behavior
    completed`` with ``again``: Airflow clears each date's finished run, a date has one
    run); its wall time, jobs run and cache hits."""
    import json

    from tests.fixtures.standalone import backfill as airflow_backfill

    dates = _dates()
    before = _jobs(s.home, dag_id)
    started = time.monotonic()
    options = ["--dag-run-conf", json.dumps({"data_root": str(data_root)}),
               "--max-active-runs", str(len(dates))]  # fmt: skip
    if again:
        options += ["--reprocess-behavior", "completed"]
    port = int(s.client.base_url.port)
    done = airflow_backfill(s.home, port, dag_id, dates[0], dates[-1], options=options)
    if done.returncode:
        raise RuntimeError(f"{dag_id}: backfill failed:\n{done.stdout}\n{done.stderr}")
    runs = s.json(f"/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]
    run_ids = [r["dag_run_id"] for r in runs]
    if len(run_ids) != len(dates):
        raise RuntimeError(f"{dag_id}: {len(run_ids)} runs for {len(dates)} dates")
    states = {run_id: s.wait_finished(dag_id, run_id) for run_id in run_ids}
    seconds = time.monotonic() - started
    failed = [run_id for run_id, state in states.items() if state != "success"]
    if failed:
        raise RuntimeError(f"{dag_id}: runs not successful: {failed}")
    hits, durations = 0, []
    for run_id in run_ids:
        train = f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/train"
        durations.append(s.json(train)["duration"])
        resp = s.api("GET", f"{train}/xcomEntries/kinetic_cache",
                     params={"deserialize": True, "stringify": False})  # fmt: skip
        hits += resp.status_code == 200 and bool((resp.json()["value"] or {}).get("hit"))
    return {"seconds": seconds, "jobs": _jobs(s.home, dag_id) - before, "hits": hits,
            "train_s": statistics.median(durations)}  # fmt: skip


def measure() -> dict[str, dict[str, Any]]:
    sys.path.insert(0, str(HERE.parent))
    from tests.fixtures.standalone import run_standalone

    with (
        tempfile.TemporaryDirectory(prefix="kinetic-bench-backfill-") as tmp,
        run_standalone(Path(tmp), HERE / "backfill_dags.py") as s,
    ):
        data = Path(tmp) / "data"
        write_data(data)
        for dag_id in ("bench_backfill_cache", "bench_backfill_nocache"):
            s.unpause(dag_id)
        found = {
            "first": backfill(s, "bench_backfill_cache", data),
            "first_base": backfill(s, "bench_backfill_nocache", data),
        }
        print("backfill: first pass done", flush=True)
        write_data(data, CHANGED)
        found["changed"] = backfill(s, "bench_backfill_cache", data, again=True)
        found["changed_base"] = backfill(s, "bench_backfill_nocache", data, again=True)
        print("backfill: changed pass done", flush=True)
        found["again"] = backfill(s, "bench_backfill_cache", data, again=True)
    return found


def backfills() -> list[Row]:
    from backfill_dags import TRAIN_S

    found = measure()
    changed, base, again = found["changed"], found["changed_base"], found["again"]
    n = len(_dates())
    note = (
        f"wall time of each pass (one `airflow backfill create`, each job {TRAIN_S:.0f} s "
        f"of training, 4 task slots); median train task {changed['train_s']:.2f} s with "
        f"the cache, {base['train_s']:.2f} s without; first pass: "
        f"{found['first']['jobs']} jobs in {found['first']['seconds']:.0f} s with the "
        f"cache, {found['first_base']['jobs']} in {found['first_base']['seconds']:.0f} s "
        "without; every date's value checked by a task that recomputes it"
    )
    return [
        Row(
            f"{n}-date backfill under standalone, {len(CHANGED)} dates' data changed",
            f"no cache: {base['jobs']} jobs, {base['seconds']:.0f} s",
            f"{changed['jobs']} jobs + {changed['hits']} cache hits, {changed['seconds']:.0f} s",
            base["seconds"] / changed["seconds"] if changed["seconds"] else None,
            f"{len(CHANGED)} jobs",
            changed["jobs"] == len(CHANGED) and changed["hits"] == n - len(CHANGED),
            note=note,
        ),
        Row(
            f"the same {n}-date backfill again",
            f"no cache: {base['jobs']} jobs",
            f"{again['jobs']} jobs + {again['hits']} cache hits, {again['seconds']:.0f} s",
            None,
            "no job",
            again["jobs"] == 0 and again["hits"] == n,
            note="nothing changed since the last backfill",
        ),
    ]
