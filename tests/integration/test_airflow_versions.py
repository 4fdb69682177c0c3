"""What differs between the supported Airflow versions (3.1 and 3.3) behaves the same.

Run in the main venv (3.3) by the suite and in ``.venv-3.1`` by
``scripts/test-airflow31.sh``:

* the connection form: 3.2+ reads the declarative ``conn-fields`` of the provider
  info, 3.1 calls ``KineticHook.get_connection_form_widgets()``; both must show
  every field of ``provider_info.FORM`` with its label, description, type and the
  ``backend`` choices.  Checked through the API server's own hook-metadata service
  (what the UI's connection form is built from) in a fresh interpreter.
* marking a deferred task failed cancels its job, a triggerer restart does not:
  3.3 calls the trigger's ``on_kill()`` for user kills only, 3.1 calls ``cleanup()``
  for both (``triggers/userkill.py`` tells them apart).  Checked on a real
  ``airflow standalone`` plus a second real triggerer, which also serves the form's
  metadata over REST.  (Clearing a deferred task: ``test_standalone.py``, run on
  both versions too.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import airflow

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.backends.registry import backend_kinds
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.provider_info import FORM
from airflow_provider_kinetic.triggers.userkill import TRIGGERER_CALLS_ON_KILL
from tests.fixtures.standalone import (
    REPO,
    RUN_DEADLINE_S,
    _stop_group,
    run_standalone,
    standalone_env,
)

HIDDEN = ("host", "port", "login", "password", "url_schema")
JSON_TYPES = {"string": "string", "boolean": "boolean", "number": ("number", "integer")}

_HOOK_META = """
import json
from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

(meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "kinetic"]
print("OUT " + json.dumps(meta.model_dump(mode="json")))
"""


def _assert_form(meta: dict[str, Any]) -> None:
    """Every FORM field with its label/description/type; backend choices; no host etc."""
    extras = meta["extra_fields"]
    assert set(extras) == set(FORM), set(extras) ^ set(FORM)
    for name, (label, kind, _placeholder, description) in FORM.items():
        field = extras[name]
        assert field["schema"]["title"] == label, name
        assert field["description"] == description, name
        types = field["schema"]["type"]
        assert "null" in types and types[0] in JSON_TYPES[kind], (name, types)
    assert extras["backend"]["schema"]["enum"] == [*backend_kinds(), None]
    for name in HIDDEN:
        assert meta["standard_fields"][name]["hidden"] is True, name


def test_connection_form_has_every_field_on_this_airflow():
    out = subprocess.run(
        [sys.executable, "-c", _HOOK_META], capture_output=True, text=True, check=True
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("OUT "))
    meta = json.loads(line[4:])
    assert meta["hook_class_name"] == "airflow_provider_kinetic.hooks.kinetic.KineticHook"
    _assert_form(meta)


@contextlib.contextmanager
def _cancel_jobs_left_running(root: Path) -> Iterator[None]:
    """Local jobs run in their own sessions (stopping standalone leaves them running):
    cancel any that a failing test left behind."""
    try:
        yield
    finally:
        backend = LocalBackend(str(root))
        for handle_file in root.glob("job-*/handle.json"):
            backend.cancel(JobHandle.from_dict(json.loads(handle_file.read_text())))


def _trigger_logs(home: Path, dag_id: str, run_id: str) -> dict[str, str]:
    """Each triggerer writes the trigger's log to a file of its own: name -> text."""
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=work"
    return {p.name: p.read_text() for p in folder.glob("attempt=1.log.trigger.*.log")}


def _triggerer_pids(cwd: Path) -> dict[int, int]:
    """Live ``airflow triggerer`` processes started in ``cwd`` -> their parents (the
    triggerer forks its trigger runner and log server, which keep its command line)."""
    pids = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
            here = Path(os.readlink(proc / "cwd")) == cwd
        except OSError:
            continue
        if here and fields[0] != "Z" and b"triggerer" in args[1:3]:
            pids[int(proc.name)] = int(fields[1])
    return pids


def test_user_kill_cancels_the_job_and_a_triggerer_restart_does_not(tmp_path: Path):
    """A real triggerer runs the trigger (its log says the trigger started).  It is
    stopped: the job keeps running and the task stays deferred.  A new triggerer takes
    the trigger over; the user marks the task failed and the job is cancelled (3.3:
    trigger on_kill; 3.1: trigger cleanup sees the task is no longer deferred)."""
    dag_id, run_id = "kinetic_kill", "mark_failed_run"
    root = tmp_path / "standalone-home" / "kinetic"
    with (
        _cancel_jobs_left_running(root),
        run_standalone(tmp_path, REPO / "tests" / "dags" / "kinetic_kill_dags.py") as s,
    ):
        s.unpause(dag_id)
        s.trigger(dag_id, run_id)
        # The UI's connection form, while the run starts (the first call imports every
        # provider's hook: slow on a busy machine).
        resp = s.client.get("/ui/connections/hook_meta", timeout=RUN_DEADLINE_S)
        assert resp.status_code == 200, resp.text
        (meta,) = [m for m in resp.json() if m["connection_type"] == "kinetic"]
        _assert_form(meta)

        ti_path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/work"

        def running(old: set[str]) -> list[str]:
            """Trigger logs (not in ``old``) where the triggerer started the trigger."""
            started = f"trigger {dag_id}/{run_id}/work/-1/1 (ID "
            return [
                name
                for name, text in _trigger_logs(s.home, dag_id, run_id).items()
                if name not in old
                and any(started in line and ") starting" in line for line in text.splitlines())
            ]

        (first_log,) = s.wait_for("the trigger to run", lambda: running(set()), 120)
        jobs_dir = s.home / "kinetic" / ".local-jobs"
        (job,) = list(jobs_dir.iterdir())

        triggerers = _triggerer_pids(tmp_path)
        (old_triggerer,) = [pid for pid, parent in triggerers.items() if parent not in triggerers]
        os.kill(old_triggerer, signal.SIGTERM)
        s.wait_for("the triggerer to stop", lambda: not _triggerer_pids(tmp_path), 60)
        assert not (job / "exit_code").exists() and not (job / "cancelled").exists()
        assert s.json(ti_path)["state"] == "deferred"
        if not TRIGGERER_CALLS_ON_KILL:  # 3.1: cleanup() asked the API server, kept the job
            assert "task still deferred" in _trigger_logs(s.home, dag_id, run_id)[first_log]

        env = standalone_env(s.home, s.client.base_url.port)
        with (tmp_path / "triggerer-2.log").open("wb") as log:
            new_triggerer = subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), "triggerer"],
                cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            s.wait_for("the new triggerer to take the trigger over",
                       lambda: running({first_log}), 120)  # fmt: skip
            assert not (job / "exit_code").exists()  # still running (it waits 300 s)

            resp = s.api("PATCH", ti_path, json={"new_state": "failed"})
            assert resp.status_code == 200, resp.text
            s.wait_for(
                f"job {job.name} to be cancelled (Airflow {airflow.__version__})",
                lambda: (job / "cancelled").exists() and (job / "exit_code").exists(),
                120,
            )
        finally:
            _stop_group(new_triggerer)  # standalone's own stop: SIGTERM, then SIGKILL
        assert (job / "exit_code").read_text() != "0"
        assert s.wait_finished(dag_id, run_id) == "failed"
        ti = s.json(ti_path)
        assert ti["state"] == "failed" and ti["try_number"] == 1
        assert [p.name for p in jobs_dir.iterdir()] == [job.name]  # no second job
