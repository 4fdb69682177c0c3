"""The example DAG through a real ``airflow standalone``, triggered over the REST API.

Unlike ``dag.test()`` (which runs triggers inline), here the deferrable
``KineticRunOperator`` hands its ``KineticJobTrigger`` to the real triggerer process,
a separate LocalExecutor worker resumes the task, and results are read back through
the public REST API v2.  Standalone runs in its own temporary AIRFLOW_HOME; the test
session's Airflow environment is left alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import record_key
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.standalone import (
    REPO,
    RUN_DEADLINE_S,
    USERS,
    Standalone,
    backfill,
    run_standalone,
)

DAG_ID = "retrain_daily"
RUN_ID = "standalone_rest_run"
TRIGGER = "airflow_provider_kinetic.triggers.job.KineticJobTrigger"


DAGS = REPO / "tests" / "dags"


@pytest.fixture(scope="module")
def s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """One standalone for the module (a boot costs a minute of CPU on a busy machine):
    the example DAG and the clear, live-log and links DAGs, each test with its own run
    and its own DAG's jobs; an admin and a viewer.  Deferrable tasks defer at once: the
    example's job may end within the operator's watch (which would collect it without
    the triggerer these tests are about)."""
    dags = (
        "kinetic_clear_dags.py",
        "kinetic_live_dags.py",
        "kinetic_links_dags.py",
        "kinetic_end_task_dags.py",
    )
    with run_standalone(
        tmp_path_factory.mktemp("standalone"),
        extra_dag_files=[DAGS / name for name in dags],
        env={"AIRFLOW__KINETIC__DEFER_GRACE_S": "0", **USERS},
    ) as server:
        yield server


def test_retrain_daily_through_real_triggerer(s: Standalone):
    _run_and_check(s)


def _run_and_check(s: Standalone) -> None:
    s.unpause(DAG_ID)
    s.trigger(DAG_ID, RUN_ID)

    run_path = f"/dags/{DAG_ID}/dagRuns/{RUN_ID}"
    triggers_seen: set[str] = set()

    def finished() -> str | None:
        train = s.api("GET", run_path + "/taskInstances/train")
        if train.status_code == 200 and train.json().get("trigger"):  # only while deferred
            triggers_seen.add(train.json()["trigger"]["classpath"])
        state = s.json(run_path)["state"]
        return state if state in ("success", "failed") else None

    state = s.wait_for(f"run {RUN_ID} to finish", finished, RUN_DEADLINE_S)
    tis = {ti["task_id"]: ti for ti in s.json(run_path + "/taskInstances")["task_instances"]}
    states = {task_id: ti["state"] for task_id, ti in tis.items()}
    assert state == "success", (states, _failed_tasks(s, DAG_ID, RUN_ID))
    assert states == {"make_dataset": "success", "train": "success", "check_outputs": "success"}

    def xcom(task_id: str, key: str) -> Any:
        return s.xcom(DAG_ID, RUN_ID, task_id, key)

    metrics = xcom("train", "return_value")
    assert metrics["rows"] == 512 and metrics["epochs"] == 200
    assert metrics["final_loss"] < metrics["initial_loss"]
    job = xcom("train", "kinetic_job")
    assert job["backend"] == "local" and job["func_name"] == "train_fn"
    assert job["bucket_name"] == str(s.home / "kinetic")
    output_dir = xcom("train", "output_dir")
    assert output_dir.startswith(f"file://{s.home}/kinetic/outputs/{DAG_ID}/")
    out = Path(output_dir[len("file://") :])
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert xcom("check_outputs", "return_value")["files"] == ["metrics.json", "model.pt"]

    # The wait happened in the real triggerer: while deferred the TI pointed at our
    # trigger, and the triggerer wrote the trigger's own log lines into the TI's
    # ``.log.trigger.<id>.log`` file (served merged with the task log).  The
    # triggerer's stdout does not name triggers.
    assert triggers_seen == {TRIGGER}, triggers_seen
    assert tis["train"]["try_number"] == 1

    entries = s.task_log(DAG_ID, RUN_ID, "train")
    events = [str(e.get("event")) for e in entries]
    assert any(".log.trigger." in e for e in events), events[:5]
    assert "Pausing task as DEFERRED. " in events
    trigger_lines = [str(e["event"]) for e in entries if e.get("logger") == TRIGGER]
    assert any(line.endswith(": RUNNING") for line in trigger_lines), trigger_lines
    # The end is the resumed worker's line.  A trigger's last lines may never reach the
    # file: Airflow's triggerer reads them from the runner's log socket while its
    # "finished" message arrives on another, and closes the trigger's log file on that
    # message (jobs/triggerer_job_runner.py, _handle_request), so later lines go to the
    # triggerer's own log (under load the trigger's SUCCEEDED line once did).
    assert any(re.search(r"kinetic job \S+ finished: SUCCEEDED", e) for e in events), events[-20:]
    assert "Trigger fired event" in events
    assert "Starting the triggerer" in s.log_path.read_text(errors="replace")


def test_clearing_a_deferred_task_runs_one_new_job(s: Standalone, tmp_path: Path):
    """A clear while deferred means "run it again": the old job is cancelled (never
    adopted), one new job runs, and the task succeeds on its second try."""
    dag_id, run_id, marker = "kinetic_clear", "clear_run", tmp_path / "executions"
    jobs_dir = s.home / "kinetic" / ".local-jobs"
    before = set(jobs_dir.iterdir()) if jobs_dir.is_dir() else set()
    s.unpause(dag_id)
    s.trigger(dag_id, run_id, {"marker": str(marker)})
    ti_path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/work"

    def deferred_and_running() -> bool:
        ti = s.api("GET", ti_path)
        return ti.status_code == 200 and ti.json()["state"] == "deferred" and marker.exists()

    s.wait_for("the task to defer while its job runs", deferred_and_running, RUN_DEADLINE_S)
    # The clear comes once the trigger waits on the job (what a user clears), not in the
    # moment the scheduler is still taking in the deferring exit: Airflow 3.1's
    # scheduler dies (StaleDataError: the clear gave the task instance a new id under
    # its transaction, seen in 1 of ~15 runs under load here), whoever's task it is.
    triggers = s.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=work"

    def trigger_waits() -> bool:
        taken_in = f"TaskInstance Finished: dag_id={dag_id}, task_id=work, run_id={run_id}"
        if taken_in not in s.log_path.read_text(errors="replace"):
            return False
        logs = triggers.glob("attempt=1.log.trigger.*.log")
        return any(": RUNNING" in p.read_text(errors="replace") for p in logs)

    s.wait_for("its trigger to wait on the job", trigger_waits, RUN_DEADLINE_S)
    (first_job,) = [p.name for p in set(jobs_dir.iterdir()) - before]
    resp = s.api(
        "POST",
        f"/dags/{dag_id}/clearTaskInstances",
        json={"dry_run": False, "dag_run_id": run_id, "task_ids": ["work"],
              "only_failed": False, "reset_dag_runs": True},
    )  # fmt: skip
    assert resp.status_code == 200, resp.text

    state = s.wait_finished(dag_id, run_id)
    assert state == "success", _failed_tasks(s, dag_id, run_id)
    ti = s.json(ti_path)
    assert ti["state"] == "success" and ti["try_number"] == 2
    value = s.api(
        "GET", ti_path + "/xcomEntries/return_value", params={"deserialize": True}
    ).json()["value"]
    assert value == "execution 2"
    # Exactly one new job: the store's history knows two of this DAG, the first
    # cancelled by the clear, the second succeeded; both were collected, so their
    # local state went.
    store = LocalStore(str(s.home / "kinetic"))
    entries = {e["job_id"]: e for e in history.entries(store) if e.get("dag_id") == dag_id}
    assert len(entries) == 2 and first_job in entries, entries
    assert entries[first_job]["state"] == "CANCELLED"
    (second,) = [e for j, e in entries.items() if j != first_job]
    assert second["state"] == "SUCCEEDED"
    assert set(jobs_dir.iterdir()) - before == set()
    assert marker.read_text().count("run") == 2


def test_backfill_of_the_daily_retraining_over_three_dates(s: Standalone):
    """``airflow backfill create`` under standalone: one run per date, each with its own
    output dir and its own rendered ``Data("/.../{{ ds }}/")`` path."""
    dates = ["2026-11-10", "2026-11-11", "2026-11-12"]
    s.unpause(DAG_ID)
    done = backfill(s.home, int(s.client.base_url.port), DAG_ID, dates[0], dates[-1])
    assert done.returncode == 0, done.stdout + done.stderr

    def all_done() -> list[dict] | None:
        runs = [
            r for r in s.json(f"/dags/{DAG_ID}/dagRuns")["dag_runs"] if r["run_type"] == "backfill"
        ]
        if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        return None

    runs = s.wait_for("three backfilled runs", all_done, RUN_DEADLINE_S * 2)
    assert sorted(r["state"] for r in runs) == ["success"] * 3, runs
    assert sorted(r["logical_date"][:10] for r in runs) == dates
    outputs, rendered = set(), set()
    for r in runs:
        path = f"/dags/{DAG_ID}/dagRuns/{r['dag_run_id']}/taskInstances/train"
        out = s.api("GET", path + "/xcomEntries/output_dir", params={"deserialize": True}).json()[
            "value"
        ]
        assert (Path(out[len("file://") :]) / "metrics.json").exists()
        outputs.add(out)
        rendered.add(str(s.json(path)["rendered_fields"]["op_kwargs"]))
    assert len(outputs) == 3  # one output dir per run
    for day in dates:  # each run's Data path rendered with its own ds
        assert sum(f"/{day}/" in text for text in rendered) == 1, rendered


def test_task_log_shows_the_job_log_while_deferred(s: Standalone, tmp_path: Path):
    """The job prints a tick line every half second until the test releases it; the task
    log read through the REST API while the task is still deferred already holds the
    early lines, and the final log holds every line once, in order."""
    dag_id, run_id, release = "kinetic_live", "live_run", tmp_path / "release"
    s.unpause(dag_id)
    s.trigger(dag_id, run_id, {"release": str(release)})
    ti_path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/tick"

    def early_lines_while_deferred() -> list[str] | None:
        if s.json(ti_path)["state"] != "deferred":
            return None
        resp = s.api(
            "GET",
            ti_path + "/logs/1",
            params={"full_content": True},
            headers={"Accept": "application/json"},
        )
        if resp.status_code != 200:
            return None
        events = [str(e.get("event")) for e in resp.json()["content"]]
        ticks = [e for e in events if "] tick " in e]
        return ticks if len(ticks) >= 3 else None

    ticks = s.wait_for(
        "job lines in the log of the deferred task", early_lines_while_deferred, RUN_DEADLINE_S
    )
    assert ticks[0].endswith("tick 0") and s.json(ti_path)["state"] == "deferred"
    release.touch()  # the job ends only now: the lines above were read while it ran

    assert s.wait_finished(dag_id, run_id) == "success"
    resp = s.api(
        "GET", ti_path + "/logs/1", params={"full_content": True},
        headers={"Accept": "application/json"},
    )  # fmt: skip
    events = [str(e.get("event")) for e in resp.json()["content"]]
    lines = [e.rsplit("] ", 1)[1] for e in events if "] tick " in e]
    count = s.api(
        "GET", ti_path + "/xcomEntries/return_value", params={"deserialize": True}
    ).json()["value"]
    assert count >= 3 and lines == [f"tick {i}" for i in range(count)]  # each once, in order


def test_a_viewer_cannot_download_through_a_link_out_of_the_store(s: Standalone):
    """Issue 38, case 1, on the API server itself: a job and a batch's child left links
    in their output dirs to ``/etc/passwd``, to the simple auth manager's password file
    and to ``$AIRFLOW_HOME`` (all outside the store); the viewer's downloads through
    them on the file routes of the job page and the Kinetic tab (a job's, a map task's
    batch's) answer 403 with none of the targets' content, no page lists them, and the
    link to a file inside the output dir is served as that file."""
    dag_id, run_id = "kinetic_links", "links_run"
    s.unpause(dag_id)
    s.trigger(dag_id, run_id)
    assert s.wait_finished(dag_id, run_id) == "success"
    ti_path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/links"
    job_id = s.api(
        "GET", ti_path + "/xcomEntries/kinetic_job", params={"deserialize": True}
    ).json()["value"]["job_id"]
    viewer = {"Authorization": f"Bearer {s.token('viewer')}"}
    assert (
        s.api("PATCH", f"/dags/{dag_id}", json={"is_paused": True}, headers=viewer).status_code
        == 403
    )

    secrets = [line for line in Path("/etc/passwd").read_text().splitlines() if line]
    secrets += json.loads(s.passwords_file.read_text()).values()

    def refused_but_inside(files: str, prefix: str) -> None:
        """The links out answer 403 and show nothing of their targets; the link
        inside the output dir is served."""
        for name in (
            "passwd",
            "passwords.json",
            "home/simple_auth_manager_passwords.json.generated",
        ):
            resp = s.client.get(files, params={"name": prefix + name}, headers=viewer)
            assert resp.status_code == 403, (name, resp.status_code, resp.text[:300])
            leaked = [secret for secret in secrets if secret in resp.text]
            assert not leaked and str(s.home) not in resp.text, (name, resp.text[:300])
        alias = s.client.get(files, params={"name": prefix + "alias.json"}, headers=viewer)
        assert alias.status_code == 200 and alias.json() == {"ok": True}

    refused_but_inside(f"/kinetic/jobs/{job_id}/files", "")

    for page in (f"/kinetic/jobs/{job_id}", f"/kinetic/ti/{dag_id}/{run_id}/links/-1"):
        resp = s.client.get(page, headers=viewer)
        assert resp.status_code == 200, (page, resp.status_code, resp.text[:300])
        assert "alias.json</a>" in resp.text and "metrics.json</a>" in resp.text, page
        for name in ("passwd", "passwords.json", "home"):
            assert f">{name}</a>" not in resp.text and f">{name}/" not in resp.text, page

    # The map task's tab and its batch's file route: the child's output dir, the same.
    tab = s.client.get(f"/kinetic/ti/{dag_id}/{run_id}/links_map/-1", headers=viewer)
    assert tab.status_code == 200, tab.text[:300]
    (group,) = re.findall(r"<section class='kinetic-job' data-job-id='(grp-[^']+)'", tab.text)
    assert "0/alias.json</a>" in tab.text and "0/metrics.json</a>" in tab.text
    assert "passwd</a>" not in tab.text and "passwords.json</a>" not in tab.text
    refused_but_inside(f"/kinetic/batches/{group}/files", "0/")


def test_a_deferred_task_ends_in_its_trigger_when_nothing_follows_its_job(
    s: Standalone, tmp_path: Path
):
    """Issue 46 under a real triggerer: ``train``'s job succeeds while the task is
    deferred and nothing must run on a worker after it, so its trigger ends the task
    with the job's value (no worker resumes it); the record, history and cleanup are
    the worker path's, and a plain task downstream gets the value.  ``flaky``'s first
    job fails: its task resumes on a worker and is retried, and its second job's trigger
    ends it."""
    dag_id, run_id = "kinetic_end_task", "end_task_run"
    release, marker = tmp_path / "release", tmp_path / "marker"
    s.unpause(dag_id)
    s.trigger(dag_id, run_id, {"release": str(release), "marker": str(marker)})
    run_path = f"/dags/{dag_id}/dagRuns/{run_id}"

    def all_deferred() -> bool:
        tis = s.json(run_path + "/taskInstances")["task_instances"]
        return sum(ti["state"] == "deferred" for ti in tis) == 3

    s.wait_for("the three kinetic tasks to defer", all_deferred, RUN_DEADLINE_S)
    release.touch()  # the jobs end only now, while their tasks are deferred
    state = s.wait_finished(dag_id, run_id)
    assert state == "success", _failed_tasks(s, dag_id, run_id)

    def ti(task_id: str) -> dict:
        return s.json(f"{run_path}/taskInstances/{task_id}")

    def xcom(task_id: str, key: str) -> Any:
        return s.xcom(dag_id, run_id, task_id, key)

    def log(task_id: str, try_number: int) -> list[str]:
        return [str(e.get("event")) for e in s.task_log(dag_id, run_id, task_id, try_number)]

    assert ti("train")["state"] == "success" and ti("train")["try_number"] == 1
    assert xcom("train", "return_value") == {"answer": 42, "loss": [0.5, 0.25]}
    assert xcom("train", "kinetic_usage")["attempts"] == 1
    done = xcom("train", "kinetic_progress")  # the last update, pushed by the trigger
    assert (done["step"], done["total"], done["metrics"]) == (2, 2, {"loss": 0.25})
    assert xcom("use", "return_value") == 43
    events = log("train", 1)
    assert "Pausing task as DEFERRED. " in events
    # The trigger ends the task, no worker resumes it (Airflow 3.1 and 3.3 alike).
    ends = True
    said = "kinetic: the trigger ends this task when its work succeeds"
    assert (said in events) is ends, events[-20:]
    assert any("resumed: trigger said" in e for e in events) is not ends, events[-20:]

    # The worker path's finish, done by the trigger.
    store = LocalStore(str(s.home / "kinetic"))
    job_id = xcom("train", "kinetic_job")["job_id"]
    entry = history.read(store, job_id)
    assert entry["state"] == "SUCCEEDED" and entry["artifacts"]["state"] == "deleted"
    assert not store.list(f"{job_id}/")
    identity = {"dag_id": dag_id, "run_id": run_id, "task_id": "train", "map_index": -1}
    # Sealed with the standalone's key: its fields as stored (the seal is tested elsewhere).
    record = json.loads(store.read_bytes(record_key(identity)))["record"]
    assert record["delivered"] and record["returned"] and record["handle"]["job_id"] == job_id
    value = {"return_value": {"answer": 42, "loss": [0.5, 0.25]}}
    assert record.get("xcoms") == (value if ends else None)

    # A failing job still fails its try on a worker, which Airflow retries.
    assert ti("flaky")["state"] == "success" and ti("flaky")["try_number"] == 2
    assert xcom("flaky", "return_value") == "second execution"
    first = log("flaky", 1)
    assert any("resumed: trigger said FAILED" in e for e in first), first[-20:]
    assert any("the first execution fails" in e for e in first), first[-20:]
    # One local-fallback warning for the try, though two worker segments ran it.
    assert sum("No 'kinetic_default' connection" in e for e in first) == 1, first
    assert any("resumed: trigger said" in e for e in log("flaky", 2)) is not ends

    # The Kinetic tab and jobs page show the job as the worker path leaves it: its id,
    # SUCCEEDED and its output files (the record and history they read are the same).
    tab = s.client.get(f"/kinetic/ti/{dag_id}/{run_id}/train/-1")
    assert tab.status_code == 200, tab.text[:300]
    assert f"data-job-id='{job_id}'" in tab.text and "state SUCCEEDED'>SUCCEEDED<" in tab.text
    jobs_page = s.client.get("/kinetic/")
    assert jobs_page.status_code == 200 and job_id in jobs_page.text

    # The map task's batch trigger ends it with its children's values (3.3+).
    assert xcom("sweep", "return_value") == [1, 4, 9]
    assert xcom("total", "return_value") == 14
    assert xcom("sweep", "kinetic_batch")["counts"]["succeeded"] == 3
    swept = log("sweep", 1)
    assert (said in swept) is ends, swept[-20:]
    assert any("every child has ended; collecting" in e for e in swept) is not ends, swept[-20:]
    tab = s.client.get(f"/kinetic/ti/{dag_id}/{run_id}/sweep/-1")
    group = xcom("sweep", "kinetic_batch")["group_id"]
    assert f"data-job-id='{group}'" in tab.text and tab.text.count(">SUCCEEDED<") >= 3


def _failed_tasks(s: Standalone, dag_id: str, run_id: str) -> str:
    """Each task's state, and the log tail of each try that did not succeed."""
    tis = s.json(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    out = [f"{ti['task_id']}: {ti['state']} (try {ti['try_number']})" for ti in tis]
    for ti in tis:
        if ti["state"] != "success":
            for n in range(1, int(ti["try_number"] or 1) + 1):
                lines = [str(e.get("event")) for e in s.task_log(dag_id, run_id, ti["task_id"], n)]
                out += [f"--- {ti['task_id']} try {n}", *lines[-25:]]
    return "\n".join(out)
