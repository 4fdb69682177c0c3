"""Two deferrable sweeps under a real ``airflow standalone``, a triggerer restart midway.

``dag.test()`` runs triggers inline; here the scheduler, a LocalExecutor worker and
the real triggerer run them.  Two DAGs of 6 inputs each (``max_concurrent=2``,
children of 8-10 s, longer than the operator's watch, so both batches defer) run at
once under ``[kinetic] local_max_jobs = 3``.  While both are deferred, the triggerer
is stopped and a new one takes their triggers over.  Then:

* each sweep deferred once (one trigger per task instance, named in its logs) and
  its worker resumed once, to collect;
* every line of all 12 children is in the final task logs (served by the API, the
  trigger logs of both triggerers merged in), once and in order per child;
* no more than 3 children ran at any moment, 2 per sweep (the children's own
  start and end times);
* ``kinetic_output_dirs`` names each child's own output dir.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tests.fixtures.local_jobs import most_at_once
from tests.fixtures.standalone import (
    REPO,
    Standalone,
    _stop_group,
    run_standalone,
    standalone_env,
)
from tests.integration.test_airflow_versions import _triggerer_pids

DAGS = ("kinetic_sweep_a", "kinetic_sweep_b")
INPUTS, SLOTS, LIMIT = 6, 2, 3
LINES = {i: 8 + i % 3 for i in range(INPUTS)}  # the DAG file's children: lines = seconds
STARTED = re.compile(r"trigger (\S+)/(\S+)/sweep/-1/1 \(ID (\d+)\) starting")


def _log(s: Standalone, dag_id: str) -> list[dict[str, Any]]:
    return s.task_log(dag_id, "run1", "sweep")


def _trigger_ids(home: Path, dag_id: str) -> set[str]:
    folder = home / "logs" / f"dag_id={dag_id}" / "run_id=run1" / "task_id=sweep"
    found = set()
    for path in folder.glob("attempt=1.log.trigger.*.log"):
        found |= {m.group(3) for m in STARTED.finditer(path.read_text(errors="replace"))}
    return found


def _xcom(s: Standalone, dag_id: str, key: str) -> Any:
    path = f"/dags/{dag_id}/dagRuns/run1/taskInstances/sweep/xcomEntries/{key}"
    return s.json(path + "?deserialize=true")["value"]


def _why(s: Standalone, tmp_path: Path, states: dict[str, str]) -> str:
    """What a failed sweep's task log and the second triggerer's log end with."""
    parts = [str(states)]
    for dag_id, state in states.items():
        if state != "success":
            events = [str(e.get("event")) for e in _log(s, dag_id)]
            parts.append(f"--- {dag_id} task log (last 60 lines) ---\n" + "\n".join(events[-60:]))
    tail = (tmp_path / "triggerer-2.log").read_text(errors="replace").splitlines()[-60:]
    parts.append("--- triggerer-2.log (last 60 lines) ---\n" + "\n".join(tail))
    return "\n".join(parts)


def test_two_sweeps_defer_once_keep_every_line_and_share_three_slots(tmp_path: Path) -> None:
    env = {
        "AIRFLOW__KINETIC__LOCAL_MAX_JOBS": str(LIMIT),
        "KINETIC_LOCAL_SLOTS": str(tmp_path / "slots"),  # this test's machine limit alone
    }
    dag_file = REPO / "tests" / "dags" / "kinetic_sweep_standalone_dags.py"
    with run_standalone(tmp_path, dag_file, env=env) as s:
        for dag_id in DAGS:
            s.unpause(dag_id)
        for dag_id in DAGS:
            s.trigger(dag_id, "run1")

        def both_deferred_with_lines() -> bool:
            for dag_id in DAGS:
                ti = s.json(f"/dags/{dag_id}/dagRuns/run1/taskInstances/sweep")
                if ti["state"] != "deferred" or not _trigger_ids(s.home, dag_id):
                    return False
            return all(any(" child " in str(e.get("event")) for e in _log(s, d)) for d in DAGS)

        s.wait_for("both sweeps deferred, children talking", both_deferred_with_lines, 180)
        triggerers = _triggerer_pids(tmp_path)
        (old,) = [pid for pid, parent in triggerers.items() if parent not in triggerers]
        os.kill(old, signal.SIGTERM)
        s.wait_for("the triggerer to stop", lambda: not _triggerer_pids(tmp_path), 60)
        with (tmp_path / "triggerer-2.log").open("wb") as log:
            new = subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), "triggerer"],
                cwd=tmp_path, env={**standalone_env(s.home, s.client.base_url.port), **env},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            states = {d: s.wait_finished(d, "run1") for d in DAGS}
        finally:
            _stop_group(new)
        assert states == dict.fromkeys(DAGS, "success"), _why(s, tmp_path, states)

        windows = []
        for dag_id in DAGS:
            name = dag_id[-1]
            assert _xcom(s, dag_id, "return_value") == list(range(INPUTS))
            # One deferral: one trigger for the task (both triggerers ran the same one).
            assert len(_trigger_ids(s.home, dag_id)) == 1, _trigger_ids(s.home, dag_id)
            events = [str(e.get("event")) for e in _log(s, dag_id)]
            assert sum("deferring until every child has ended" in e for e in events) == 1
            assert sum(e == "Pausing task as DEFERRED. " for e in events) == 1
            shown: dict[int, list[str]] = defaultdict(list)
            for e in events:
                m = re.search(rf"\[child (\d+)\] ({name} child \d+ line \d+)$", e)
                if m:
                    shown[int(m.group(1))].append(m.group(2))
            for i, count in LINES.items():  # every line once, in order, per child
                assert shown[i] == [f"{name} child {i} line {j:02d}" for j in range(count)], i
            dirs = _xcom(s, dag_id, "kinetic_output_dirs")
            assert [d.rstrip("/").rsplit("/", 1)[1] for d in dirs] == [str(i) for i in range(6)]
            mine = []
            for d in dirs:
                times = json.loads((Path(unquote(urlparse(d).path)) / "times.json").read_text())
                mine.append((times["start"], times["end"]))
            assert most_at_once(mine) <= SLOTS
            windows += mine
        assert most_at_once(windows) <= LIMIT
        print(f"children at once: {most_at_once(windows)} (limit {LIMIT})")
