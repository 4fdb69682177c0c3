"""Hostile identifiers under a real scheduler: run ids with ``:``, ``+``, ``~``, spaces
and non-ASCII, task ids all non-ASCII, every run live at once (``airflow standalone``,
REST API).  Every (run, task) gets its own job, output dir and value, and ``jobs
list`` shows the real ids.  Before injective keys, the runs' records and output dirs
collided (``exp_1``, ``_``) and later runs adopted the first run's job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from tests.fixtures.standalone import REPO, RUN_DEADLINE_S, run_standalone, standalone_env

DAG_ID = "kinetic_hostile_ids"
RUN_IDS = ["exp:1", "exp+1", "exp~1 é"]
TASKS = ["训练", "学习"]


def test_hostile_run_and_task_ids_under_a_real_scheduler(tmp_path: Path):
    barrier = tmp_path / "barrier"
    env = {
        "AIRFLOW__SCHEDULER__ALLOWED_RUN_ID_PATTERN": r"^.+$",  # spaces and non-ASCII too
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW_VAR_KINETIC_BARRIER": str(barrier),
    }
    dag_file = REPO / "tests" / "dags" / "kinetic_hostile_dags.py"
    with run_standalone(tmp_path, dag_file, env=env) as s:
        s.unpause(DAG_ID)
        for run_id in RUN_IDS:
            s.trigger(DAG_ID, run_id, logical_date=None)
        for run_id in RUN_IDS:
            assert s.wait_finished(DAG_ID, run_id) == "success", s.tail()

        values, jobs, outputs = {}, set(), set()
        for run_id in RUN_IDS:
            for task_id in TASKS:
                base = (
                    f"/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
                    f"/taskInstances/{urllib.parse.quote(task_id, safe='')}/xcomEntries/"
                )

                def xcom(key: str, base: str = base):  # noqa: ANN202
                    params = {"deserialize": True, "stringify": False}
                    resp = s.api("GET", base + key, params=params)
                    assert resp.status_code == 200, resp.text
                    return resp.json()["value"]

                values[(run_id, task_id)] = xcom("return_value")
                jobs.add(xcom("kinetic_job")["job_id"])
                outputs.add(xcom("output_dir"))
        for (run_id, task_id), value in values.items():
            assert (value["rid"], value["task"]) == (run_id, task_id)
            written = json.loads((Path(value["out"]) / "who.json").read_text())
            assert written == [run_id, task_id]
        assert len(jobs) == len(outputs) == len(RUN_IDS) * len(TASKS)
        assert len(os.listdir(barrier)) == len(RUN_IDS) * len(TASKS)  # each ran once

        cli_env = standalone_env(s.home, int(s.client.base_url.port))
        listed = subprocess.run(
            [sys.executable, "-m", "airflow_provider_kinetic.cli", "jobs", "list", "-o", "json"],
            capture_output=True, text=True, env=cli_env, timeout=RUN_DEADLINE_S,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        shown = {(r["dag_id"], r["run_id"], r["task_id"]) for r in rows}
        assert shown == {(DAG_ID, r, t) for r in RUN_IDS for t in TASKS}
