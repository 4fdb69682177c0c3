"""A deployment's XCom backend and a triggerer restart under a real ``airflow standalone``.

Issue 42: the deployment's XCom backend is respected, and a deferrable task's log
stays quiet and exact across a triggerer restart.

One standalone for the module, with ``[core] xcom_backend`` set to the common.io
object-storage backend (values of 1 KiB or more are written under its
``xcom_objectstorage_path``, a dir in the standalone's home) and no
``kinetic_default`` connection (the local fallback, with its warning).  The DAGs are
``tests/dags/kinetic_deployment_dags.py``.

* A Kinetic task returns a 3 MB value: it pushes the value itself, not a
  ``{"kinetic_result": ...}`` reference, the backend offloads it to a file, and a plain
  ``@task`` downstream receives the value and checks it against the value made again.
* A deferrable Kinetic task's job prints numbered lines in three parts, each waiting for
  the test: the first before the task defers (shown by the worker or the trigger), the
  second once the trigger follows the job, the third after the restart.  While the
  trigger follows the log, the standalone's triggerer is stopped
  (SIGTERM, as a deployment stops it; one killed outright may repeat up to
  ``logmark.SAVE_EVERY_S`` of lines, by design) and a new ``airflow triggerer`` takes
  the trigger over, continuing from the place the stopped one saved.  Every job line is
  written once over the try's log files (the worker's and both triggerers'), and the
  task log the REST API serves shows each once, in order, with one connection fallback
  warning.  The files are read too because the API's merged view drops a message equal
  to the one before it: a job line shown twice (same text, same time) shows only there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs.logmark import LOG_MARK_NAME
from airflow_provider_kinetic.core.jobs.resultref import REF_KEY
from tests.dags.kinetic_deployment_dags import BEFORE_RELEASE, LINES, big_value, summary
from tests.fixtures.standalone import (
    REPO,
    Standalone,
    _stop_group,
    run_standalone,
    standalone_env,
)
from tests.integration.test_airflow_versions import _triggerer_pids

DAG_FILE = REPO / "tests" / "dags" / "kinetic_deployment_dags.py"
OBJECT_STORAGE = "airflow.providers.common.io.xcom.backend.XComObjectStorageBackend"
FALLBACK_WARNING = "No 'kinetic_default' connection"
RESUMED = "continuing its log where this deferral left it"
STARTED = re.compile(r"trigger kinetic_quiet_log/quiet_run/follow/-1/1 \(ID \d+\) starting")


class Deployment:
    """The module's standalone, where it runs (its triggerers' cwd) and its settings."""

    def __init__(self, s: Standalone, cwd: Path, env: dict[str, str]) -> None:
        self.s, self.cwd, self.env = s, cwd, env

    @property
    def xcom_dir(self) -> Path:
        return self.s.home / "xcom-store"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    cwd = tmp_path_factory.mktemp("deployment")
    home = cwd / "standalone-home"  # run_standalone's
    env = {
        "AIRFLOW__CORE__XCOM_BACKEND": OBJECT_STORAGE,
        "AIRFLOW__COMMON_IO__XCOM_OBJECTSTORAGE_PATH": f"file://{home}/xcom-store",
        "AIRFLOW__COMMON_IO__XCOM_OBJECTSTORAGE_THRESHOLD": "1024",
        # The job's first lines: a second in the worker, then in the trigger.
        "AIRFLOW__KINETIC__DEFER_GRACE_S": "1",
    }
    with run_standalone(cwd, DAG_FILE, env=env) as s:
        yield Deployment(s, cwd, env)


def _events(s: Standalone, dag_id: str, run_id: str, task_id: str) -> list[str]:
    return [str(e.get("event")) for e in s.task_log(dag_id, run_id, task_id)]


def _stored(s: Standalone, dag_id: str, run_id: str, task_id: str) -> Any:
    """The XCom ``return_value`` as the database holds it (not deserialized)."""
    path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    resp = s.api("GET", path, params={"deserialize": False, "stringify": False})
    assert resp.status_code == 200, f"{path}: {resp.text}"
    return resp.json()["value"]


def test_a_3_mb_value_goes_itself_through_the_object_storage_backend(d: Deployment):
    s, dag_id, run_id = d.s, "kinetic_xcom_offload", "offload_run"
    s.unpause(dag_id)
    s.trigger(dag_id, run_id)
    state = s.wait_finished(dag_id, run_id)
    tis = s.json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    states = {ti["task_id"]: ti["state"] for ti in tis}
    assert state == "success", (states, _events(s, dag_id, run_id, "check_big")[-30:])
    assert states == {"big": "success", "check_big": "success"}

    expected = big_value()
    assert len(expected) == 3_000_000
    # The downstream received the value itself and found it equal to the value made again.
    assert s.xcom(dag_id, run_id, "check_big", "return_value") == summary(expected)
    # Kinetic pushed the value: no reference, no "does not fit XCom" warning ...
    big_log = _events(s, dag_id, run_id, "big")
    assert not [e for e in big_log if "does not fit XCom" in e], big_log
    assert sum(FALLBACK_WARNING in e for e in big_log) == 1, big_log
    stored = _stored(s, dag_id, run_id, "big")
    assert isinstance(stored, str) and REF_KEY not in stored, str(stored)[:300]
    # ... and the backend offloaded it: the database holds the path of a file in the
    # object-storage dir, and the file holds the value.
    path = Path(stored.removeprefix("file://"))
    assert path.is_relative_to(d.xcom_dir), (stored, d.xcom_dir)
    assert json.loads(path.read_text()) == expected
    files = [p for p in d.xcom_dir.rglob("*") if p.is_file()]
    assert path in files, files
    # One copy: Kinetic pushes the value before its record says "delivered"
    # (operators.common.push_value) and turns Airflow's own push of the returned value
    # off for the try, which would write a second file (each push of a key is a new
    # file there, and Airflow 3.3 purges none it replaces).
    large = [p for p in files if p.stat().st_size > 1_000_000]
    assert large == [path], large


def _trigger_files(home: Path, dag_id: str, run_id: str, task_id: str) -> list[Path]:
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    return sorted(folder.glob("attempt=1.log.trigger.*.log"))


def _written(home: Path, dag_id: str, run_id: str, task_id: str) -> list[str]:
    """Every message the try's log files hold (the worker's and each triggerer's), as
    written (see the module doc: a repeat shows only here)."""
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    found = []
    for path in sorted(folder.glob("attempt=1.log*")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                found.append(str(json.loads(line).get("event")))
            except (ValueError, AttributeError):
                found.append(line)
    return found


def _trigger_text(home: Path, dag_id: str, run_id: str, task_id: str) -> str:
    return "".join(
        p.read_text(errors="replace") for p in _trigger_files(home, dag_id, run_id, task_id)
    )


def test_a_triggerer_restart_repeats_no_line_and_the_fallback_warns_once(d: Deployment):
    s, dag_id, run_id, task_id = d.s, "kinetic_quiet_log", "quiet_run", "follow"
    files = d.cwd / "quiet"  # the job's go and release files
    files.mkdir()
    line = f"quiet-log line {BEFORE_RELEASE - 1:02d} of {LINES}"
    s.unpause(dag_id)
    s.trigger(dag_id, run_id, {"files": str(files)})
    ti_path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"

    def deferred_and_started() -> bool:
        started = STARTED.findall(_trigger_text(s.home, dag_id, run_id, task_id))
        return s.json(ti_path)["state"] == "deferred" and len(started) == 1

    s.wait_for("the task to defer and its trigger to start", deferred_and_started, 180)
    (files / "go").touch()
    s.wait_for(
        "the trigger to show the lines before the release",
        lambda: line in _trigger_text(s.home, dag_id, run_id, task_id),
        120,
    )
    shown_by_trigger = _trigger_text(s.home, dag_id, run_id, task_id)
    (job_id,) = set(re.findall(r"\[(\S+)\] quiet-log line", shown_by_trigger))

    # Stop the standalone's triggerer while its trigger follows the job (which waits).
    triggerers = _triggerer_pids(d.cwd)
    (old,) = [pid for pid, parent in triggerers.items() if parent not in triggerers]
    os.kill(old, signal.SIGTERM)
    s.wait_for("the triggerer to stop", lambda: not _triggerer_pids(d.cwd), 60)
    assert s.json(ti_path)["state"] == "deferred"
    mark = s.home / "kinetic" / job_id / LOG_MARK_NAME  # the stopped trigger's place
    assert mark.exists(), sorted(p.name for p in mark.parent.iterdir())

    env = {**standalone_env(s.home, s.client.base_url.port), **d.env}
    with (d.cwd / "triggerer-2.log").open("wb") as log:
        new = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "triggerer"],
            cwd=d.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        s.wait_for(
            "the new triggerer to start the trigger again",
            lambda: len(STARTED.findall(_trigger_text(s.home, dag_id, run_id, task_id))) == 2,
            180,
        )
        (files / "release").touch()
        state = s.wait_finished(dag_id, run_id)
    finally:
        _stop_group(new)
    events = _events(s, dag_id, run_id, task_id)
    assert state == "success", events[-40:]

    numbered = re.compile(r"\] (quiet-log line \d\d of \d+)$")
    expected = [f"quiet-log line {i:02d} of {LINES}" for i in range(LINES)]
    # Each line written once, over the worker's log and both triggerers' ...
    written = [
        m.group(1) for e in _written(s.home, dag_id, run_id, task_id) if (m := numbered.search(e))
    ]
    repeated = {text: n for text, n in Counter(written).items() if n > 1}
    assert not repeated, repeated
    assert sorted(written) == expected, written
    # ... and the task log as the API serves it: every line once, in order.
    shown = [m.group(1) for e in events if (m := numbered.search(e))]
    assert shown == expected, shown
    # Both triggerers ran the trigger: the second resumed from the first's place.
    assert sum(RESUMED in e for e in events) == 1, [e for e in events if "kinetic job" in e]
    assert "Starting the triggerer" in (d.cwd / "triggerer-2.log").read_text(errors="replace")
    # One fallback warning for the try, though three processes ran it (the worker that
    # deferred, both triggerers, the worker that resumed).
    assert sum(FALLBACK_WARNING in e for e in _written(s.home, dag_id, run_id, task_id)) == 1
    assert sum(FALLBACK_WARNING in e for e in events) == 1
