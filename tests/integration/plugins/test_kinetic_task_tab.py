"""The Kinetic tab of a task instance, without a browser: the plugin's registration
(an external view for ``task_instance`` that Airflow's plugins API accepts, on the
Airflow this runs under: the suite's 3.3, and ``.venv-3.1``), and the tab's pages
over a real map task's batch and a real running job on the local backend, with
Airflow's real auth manager and JWTs (the ``clients`` of ``test_kinetic_plugin``)."""

from __future__ import annotations

import re
import urllib.parse
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator, attach
from airflow_provider_kinetic.core.jobs.progress import read_progress
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.waiting import ended, wait_for
from tests.integration.plugins import test_kinetic_plugin as plugin_pages

#: The plugin page tests' fixtures: a local connection, and anonymous / viewer / admin
#: clients of the registered app.
conn, clients = plugin_pages.conn, plugin_pages.clients

#: A run id as Airflow makes them (":" and "+": its store key form differs).
RUN_ID = "manual__2026-11-21T00:00:00+00:00"
LOGICAL_DATE = "2026-11-21T00:00:00+00:00"


def talk(i: int) -> int:
    import os

    for j in range(3):
        print(f"child {i} says {j}", flush=True)
    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"part-{i}.txt"), "w") as f:
        f.write(str(i))
    return i


def _plugin() -> Any:
    (plugin,) = [ep.load() for ep in entry_points(group="airflow.plugins") if ep.name == "kinetic"]
    return plugin


def test_the_task_instance_tab_is_registered_and_accepted_by_the_plugins_api():
    """The plugins manager lists the tab and ``/api/v2/plugins``' model accepts it
    (an invalid entry would be skipped there, and the UI would show no tab)."""
    from airflow import plugins_manager
    from airflow.api_fastapi.core_api.datamodels.plugins import PluginResponse

    tab = [v for v in _plugin().external_views if v["destination"] == "task_instance"]
    assert tab == [
        {
            "name": "Kinetic",
            "href": "/kinetic/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}",
            "url_route": "kinetic-task",
            "destination": "task_instance",
        }
    ]
    (info,) = [p for p in plugins_manager.get_plugin_info() if p["name"] == "kinetic"]
    shown = PluginResponse.model_validate(info).model_dump()
    by_route = {view["url_route"]: view for view in shown["external_views"]}
    assert by_route["kinetic-task"]["destination"] == "task_instance"
    assert by_route["kinetic"]["destination"] == "nav"
    assert by_route["kinetic"]["category"] == "browse"


def _tab(client: Any, conn_id: str, run_id: str, task_id: str, index: str, **params: Any) -> str:
    """The tab as Airflow 3.3 asks for it (ids percent-encoded in the path)."""
    path = "/kinetic/ti/d/" + "/".join(urllib.parse.quote(p, safe="") for p in (run_id, task_id))
    resp = client.get(f"{path}/{index}", params={"conn_id": conn_id, **params})
    assert resp.status_code == 200, resp.text
    return resp.text


def test_tab_of_a_map_task_shows_its_batch_children_logs_and_files(conn, clients):
    anon, viewer, admin = clients
    ti = FakeTI(task_id="sweep", run_id=RUN_ID, try_number=2)
    op = KineticMapOperator(
        task_id="sweep", python_callable=talk, inputs=[0, 1, 2], kinetic_conn_id=conn,
        poll_interval=0.1,
    )  # fmt: skip
    assert op.execute({"ti": ti, "logical_date": _date()}) == [0, 1, 2]

    # Unmapped: the UI leaves {MAP_INDEX} in the URL; 3.1 puts the run id in raw.
    page = _tab(viewer, conn, RUN_ID, "sweep", "%7BMAP_INDEX%7D")
    raw = viewer.get(f"/kinetic/ti/d/{RUN_ID}/sweep/{{MAP_INDEX}}", params={"conn_id": conn})
    assert raw.status_code == 200 and raw.text.count("<tr data-child=") == 3
    assert f"Kinetic: d / {RUN_ID} / sweep" in page  # the exact ids, not their key form
    (section,) = re.findall(r"<section class='kinetic-job' data-job-id='(grp-[^']+)'", page)
    children = dict(re.findall(r"<tr data-child='(\d)' data-job-id='(job-[^']+)'>", page))
    assert sorted(children) == ["0", "1", "2"]
    assert page.count(">SUCCEEDED</span>") >= 3
    assert "<th>Try</th><td>2</td>" in page and LOGICAL_DATE in page
    assert "part-1.txt</a>" in page and "id='no-jobs'" not in page
    assert "class='cancel'" not in page  # nothing left to cancel
    # The log pane: child 0 (none runs); ?child=2 picks another; each row links there.
    assert re.search(rf"<pre id='log' data-job-id='{children['0']}'", page)
    other = _tab(viewer, conn, RUN_ID, "sweep", "-1", child=2)
    assert re.search(rf"<pre id='log' data-job-id='{children['2']}'", other)
    assert "child=2'>log</a>" in page

    # A child's log after its handle.json went (cleanup on success): by its batch.
    log_url = f"/kinetic/api/jobs/{children['1']}/log"
    assert viewer.get(log_url, params={"conn_id": conn}).status_code == 404
    log = viewer.get(log_url, params={"conn_id": conn, "batch": section}).json()
    assert "child 1 says 2" in log["text"], log
    assert viewer.get(log_url, params={"conn_id": conn, "batch": "grp-other"}).status_code == 404

    feed = viewer.get(f"/kinetic/api/batches/{section}/children", params={"conn_id": conn})
    assert feed.status_code == 200, feed.text
    body = feed.json()
    assert body["terminal"] is True and body["state"] == "SUCCEEDED"
    assert [(c["child"], c["state"]) for c in body["children"]] == [
        (0, "SUCCEEDED"), (1, "SUCCEEDED"), (2, "SUCCEEDED"),
    ]  # fmt: skip
    # Its progress: every child done (no ETA left to give, no child running a step).
    done = "3/3 children done (100%)"
    assert body["progress"] == {"done": 3, "total": 3, "fraction": 1.0, "eta_s": None,
                                "text": done}  # fmt: skip
    assert [c["step"] for c in body["children"]] == [None, None, None]
    assert "<progress max='1' value='1.0000'></progress> " in page
    assert f"<span class='progress-text'>{done}</span>" in page
    files = f"/kinetic/batches/{section}/files"
    assert "name=1%2Fpart-1.txt'>1/part-1.txt</a>" in page
    file = viewer.get(files, params={"conn_id": conn, "name": "1/part-1.txt"})
    assert file.status_code == 200 and file.text == "1"
    assert file.headers["content-disposition"].startswith("attachment")
    assert viewer.get(files, params={"conn_id": conn, "name": "../x"}).status_code == 400
    assert anon.get(f"/kinetic/api/batches/{section}/children").status_code == 401

    # Another task, another map index, another run: no jobs.
    assert "id='no-jobs'" in _tab(viewer, conn, RUN_ID, "other", "-1")
    assert "id='no-jobs'" in _tab(viewer, conn, RUN_ID, "sweep", "3")
    assert "id='no-jobs'" in _tab(viewer, conn, "manual__2026-11-21T00_00_00_00_00", "sweep", "-1")


def _date() -> Any:
    from datetime import datetime

    return datetime.fromisoformat(LOGICAL_DATE)


def reports_then_waits(release: str) -> int:
    """Two progress updates (the second at a later clock reading: a rate, an ETA),
    then held until ``release``."""
    import os
    import time

    from airflow_provider_kinetic import progress

    progress.update(0, total=40, metrics={"loss": 2.0})
    while time.time() == time.time():  # the second update at a later clock reading
        pass
    progress.update(10, total=40, metrics={"loss": 1.5})
    # Held here, self-contained: a function of another test module would be pickled by
    # reference, and the job cannot import the tests package.
    while not os.path.exists(release):
        time.sleep(0.05)  # timing-ok: the job's workload polls the test's release file
    return 1


def test_tab_of_a_running_job_offers_cancel_only_to_whom_may(
    conn, clients, tmp_path: Path, monkeypatch
):
    """... and shows the progress its function reported (a bar, step, ETA, metrics)."""
    _, viewer, admin = clients
    ti = FakeTI(task_id="wait")
    release = tmp_path / "release"
    monkeypatch.setenv("KINETIC_PROGRESS_MIN_S", "0")
    op = KineticRunOperator(task_id="wait", python_callable=reports_then_waits,
                            op_args=[str(release)], kinetic_conn_id=conn,
                            wait_for_completion=False,
                            capture_env_vars=["KINETIC_PROGRESS_MIN_S"])  # fmt: skip
    job_id = op.execute({"ti": ti, "logical_date": _date()})["job_id"]
    try:
        store = LocalStore(str(tmp_path / "kinetic"))
        wait_for(
            "the second update", lambda: getattr(read_progress(store, job_id), "step", None) == 10
        )
        mine = _tab(viewer, conn, "manual__1", "wait", "-1")
        assert f"<span id='progress' data-job-id='{job_id}'>" in mine
        assert "<progress max='1' value='0.2500'></progress>" in mine
        feed = viewer.get(f"/kinetic/api/jobs/{job_id}/log", params={"conn_id": conn})
        assert feed.status_code == 200, feed.text  # what the tab's script updates it from
        live = feed.json()["progress"]
        assert (live["step"], live["total"], live["fraction"]) == (10, 40, 0.25)
        assert live["text"].startswith("step 10/40 (25%), ETA ")
        assert re.search(r"class='progress-text'>step 10/40 \(25%\), ETA [^,<]+, loss 1.5<", mine)
        theirs = _tab(admin, conn, "manual__1", "wait", "-1")
        for page in (mine, theirs):
            assert f"data-job-id='{job_id}'" in page and "data-kind='job'" in page
            assert f"<pre id='log' data-job-id='{job_id}'" in page
            assert re.search(rf"id='state-{job_id}' class='state (PENDING|RUNNING)'", page)
        assert "class='cancel'" not in mine
        assert f"data-url='/kinetic/jobs/{job_id}/cancel?conn_id={conn}'" in theirs
    finally:
        release.touch()
        job = attach(job_id, conn_id=conn)
        wait_for(f"{job_id} to end", lambda: ended(job.status()))


def test_tab_of_a_queued_job_says_why_it_waits(conn, clients, tmp_path: Path, monkeypatch):
    """A job waiting for a local slot (``local_max_jobs=1``, held by another task's
    job): the tab's Waiting line and its log feed say its place and who holds the slot
    (on GKE the same line carries the queue position, the autoscaler's word and the
    flex-start request's state: ``test_why_pending_gke``)."""
    from html import escape

    from airflow_provider_kinetic.core.backends.local.slots import SLOTS_ENV

    _, viewer, _ = clients
    monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_MAX_JOBS", "1")
    monkeypatch.setenv(SLOTS_ENV, str(tmp_path / "slots"))  # this test's own slots
    release = tmp_path / "release"
    ids = []
    for task in ("holds", "queued"):
        op = KineticRunOperator(task_id=task, python_callable=reports_then_waits,
                                op_args=[str(release)], kinetic_conn_id=conn,
                                wait_for_completion=False)  # fmt: skip
        ids.append(op.execute({"ti": FakeTI(task_id=task), "logical_date": _date()})["job_id"])
    jobs = [attach(job_id, conn_id=conn) for job_id in ids]
    try:
        want = f"queued: 0 jobs ahead (local_max_jobs=1); position 1 of 1; slot held by {ids[0]}"
        wait_for("the second job queued", lambda: jobs[1].status().message == want,
                 detail=lambda: jobs[1].status())  # fmt: skip
        page = _tab(viewer, conn, "manual__1", "queued", "-1")
        assert f"<tr><th>Waiting</th><td><span id='why-{ids[1]}' class='why'>" in page
        assert f"class='why'>{escape(want)}</span>" in page
        feed = viewer.get(f"/kinetic/api/jobs/{ids[1]}/log", params={"conn_id": conn})
        assert feed.status_code == 200, feed.text  # what the tab's script updates it from
        assert (feed.json()["state"], feed.json()["message"]) == ("PENDING", want)
        holder = _tab(viewer, conn, "manual__1", "holds", "-1")
        assert f"<span id='why-{ids[0]}' class='why'>" in holder  # running: no wait to say
        assert f"class='why'>{escape(want)}" not in holder
    finally:
        release.touch()
        for job in jobs:
            wait_for(f"{job.job_id} to end", lambda job=job: ended(job.status()))


def test_tab_of_a_multi_slice_job_shows_its_slices(conn, clients, tmp_path: Path):
    """A JobSet job (``num_slices=4``, issue 43) as its history entry records it: the
    tab names its slices beside its accelerator; a single-slice job has no such row."""
    from airflow_provider_kinetic.core.jobs import history

    _, viewer, _ = clients
    store = LocalStore(str(tmp_path / "kinetic"))
    identity = {"dag_id": "d", "task_id": "train", "run_id": "manual__1", "map_index": -1,
                "try_number": 1}  # fmt: skip
    history.submitted(store, "job-5ce5ce01", identity, backend="jobset", func="train",
                      accelerator="tpu-v5p-2x2x4", output_dir=None, num_slices=4)  # fmt: skip
    history.update(store, "job-5ce5ce01", "SUCCEEDED")
    page = _tab(viewer, conn, "manual__1", "train", "-1")
    assert (
        "<tr><th>Accelerator</th><td>tpu-v5p-2x2x4</td></tr><tr><th>Slices</th><td>4</td></tr>"
    ) in page
    assert "<tr><th>Backend</th><td>jobset</td></tr>" in page
    one = {**identity, "task_id": "one"}  # a single-slice job: no Slices row
    history.submitted(store, "job-5ce5ce02", one, backend="gke", func="train",
                      accelerator="tpu-v5p-2x2x4", output_dir=None)  # fmt: skip
    single = _tab(viewer, conn, "manual__1", "one", "-1")
    assert "<td>tpu-v5p-2x2x4</td>" in single and "<th>Slices</th>" not in single
