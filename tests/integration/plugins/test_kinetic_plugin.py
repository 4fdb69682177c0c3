"""The Kinetic plugin's FastAPI app, without a browser: the app the ``airflow.plugins``
entry point registers, mounted at ``/kinetic`` as the API server mounts it, over jobs
the real local backend runs, with Airflow's real auth manager and JWTs."""

from __future__ import annotations

import re
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_provider_kinetic import KineticRunOperator, attach
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.local_conn import set_local_conn
from tests.fixtures.waiting import ended, wait_for

CONN = "kn_plugin"
NASTY = "<i>&\"x'.txt"  # an output file name that must come out escaped
#: The list's usage cells after a job's End (``plugins/views.py``), without a price table.
USAGE_CELLS = "".join(
    rf"<td class='usage' data-usage='{name}'[^>]*>[^<]*</td>"
    for name in ("capacity", "queued", "run", "chip-hours")
)


def chatty(lines: int, name: str) -> int:
    import os

    for i in range(lines):
        print(f"line {i} <script>alert({i})</script>", flush=True)
    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.json"), "w") as f:
        f.write('{"ok": true}')
    with open(os.path.join(out, name), "w") as f:
        f.write("x")
    return lines


def waits(release: str) -> int:
    import os

    print("waiting for release", flush=True)
    while not os.path.exists(release):
        time.sleep(0.05)  # timing-ok: the job's workload polls the test's release file
    return 1


@pytest.fixture
def conn(monkeypatch, tmp_path) -> str:
    set_local_conn(monkeypatch, tmp_path / "kinetic", CONN)
    return CONN


@pytest.fixture
def clients(airflow_home) -> Any:
    """Clients of the registered plugin's app under ``/kinetic``: anonymous, and signed
    in (Airflow's JWT cookie) as a viewer and as an admin."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    (plugin,) = [ep.load() for ep in entry_points(group="airflow.plugins") if ep.name == "kinetic"]
    (spec,) = plugin.fastapi_apps
    assert spec["url_prefix"] == "/kinetic"
    assert plugin.external_views[0]["href"] == "/kinetic/"
    root = FastAPI()
    root.mount(spec["url_prefix"], spec["app"])
    manager = init_auth_manager()

    def signed_in(role: str) -> TestClient:
        token = manager.generate_jwt(SimpleAuthManagerUser(username=f"u-{role}", role=role))
        return TestClient(root, cookies={"_token": token})

    with TestClient(root) as anon, signed_in("viewer") as viewer, signed_in("admin") as admin:
        yield anon, viewer, admin


def submit(conn: str, func: Any, *args: Any, task_id: str = "", wait: bool = False) -> dict:
    """Run ``func`` as task ``task_id`` (default: its name) of DAG ``d``; the handle.
    ``wait``: to the end, as a sync task does (its value delivered, its
    ``{job_id}/`` artifacts deleted)."""
    ti = FakeTI(task_id=task_id or func.__name__)
    op = KineticRunOperator(
        task_id=ti.task_id, python_callable=func, op_args=list(args), kinetic_conn_id=conn,
        wait_for_completion=wait,
    )  # fmt: skip
    result = op.execute({"ti": ti})
    return ti.xcom["kinetic_job"] if wait else result


def test_pages_of_finished_and_running_jobs_with_auth_and_cancel(conn, clients, tmp_path: Path):
    done = submit(conn, chatty, 3, NASTY)
    assert attach(done["job_id"], conn_id=conn).result(timeout=120, poll_interval=0.05) == 3
    collected = submit(conn, chatty, 2, "b.txt", task_id="collected", wait=True)
    root = tmp_path / "kinetic"
    assert not (root / collected["job_id"]).exists()  # cleanup="on_success": handle.json gone
    release = tmp_path / "release"
    running = submit(conn, waits, str(release))
    try:
        check_pages(conn, clients, done, collected, running)
    finally:  # a failed check must not leave the job running
        release.touch()
        job = attach(running["job_id"], conn_id=conn)
        wait_for(f"{job.job_id} to end", lambda: ended(job.status()))


def test_a_viewer_sees_no_cancel_button_where_cancelling_would_be_refused(
    conn, clients, tmp_path: Path
):
    """The job page of a running job, for a viewer (may read, may not cancel: the POST
    answers 403) and for an admin: only the admin's page has the Cancel button."""
    _, viewer, admin = clients
    release = tmp_path / "release"
    running = submit(conn, waits, str(release))
    try:
        path, q = f"/kinetic/jobs/{running['job_id']}", {"conn_id": conn}
        pages = {"viewer": viewer.get(path, params=q), "admin": admin.get(path, params=q)}
        for page in pages.values():
            assert page.status_code == 200, page.text
            assert "data-terminal='false'" in page.text  # running: a cancel makes sense
        assert "id='cancel'" not in pages["viewer"].text
        assert f"<button id='cancel' data-url='{path}/cancel?conn_id={conn}'" in pages["admin"].text
        headers = {"X-Kinetic-Action": "cancel"}
        assert viewer.post(f"{path}/cancel", params=q, headers=headers).status_code == 403
    finally:  # never leave the job running
        release.touch()
        job = attach(running["job_id"], conn_id=conn)
        wait_for(f"{job.job_id} to end", lambda: ended(job.status()))


def check_pages(conn: str, clients: Any, done: dict, collected: dict, running: dict) -> None:
    anon, viewer, admin = clients
    q = {"conn_id": conn}

    # No credentials: Airflow's get_user refuses.
    resp = anon.get("/kinetic/", params=q)
    assert resp.status_code == 401, resp.text

    page = viewer.get("/kinetic/", params=q)
    assert page.status_code == 200, page.text
    rows = re.findall(r"<tr data-job-id='([^']+)'>(.*?)</tr>", page.text)
    assert sorted(job for job, _ in rows) == sorted(
        [running["job_id"], done["job_id"], collected["job_id"]]
    )
    cells = dict(rows)[done["job_id"]]
    assert "SUCCEEDED" in cells and "d / manual__1 / chatty" in cells and ">local<" in cells
    assert re.search(r"<td>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ</td>" + USAGE_CELLS, cells)
    # Its usage, after its end: measured from its start record and result (cpu: no chips).
    usage = dict(re.findall(r"data-usage='([^']+)'[^>]*>([^<]*)</td>", cells))
    assert usage["capacity"] == "on-demand" and usage["chip-hours"] == "no chips"
    assert re.fullmatch(r"\d+s|\d+\.\dm", usage["run"]) and usage["queued"]
    assert re.search("RUNNING|PENDING", dict(rows)[running["job_id"]])
    # Listed and shown from its sealed task record (the task's job link keeps working).
    cells = dict(rows)[collected["job_id"]]
    assert "SUCCEEDED" in cells and "d / manual__1 / collected" in cells
    assert re.search(r"<td>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ</td>" + USAGE_CELLS + "$", cells)
    shown = viewer.get(f"/kinetic/jobs/{collected['job_id']}", params=q)
    assert shown.status_code == 200 and "b.txt</a>" in shown.text
    assert (
        "line 1 <script>"
        in viewer.get(f"/kinetic/api/jobs/{collected['job_id']}/log", params=q).json()["text"]
    )
    link = f"/kinetic/jobs/{done['job_id']}?conn_id={conn}"
    assert f"href='{link}'" in page.text  # under the mount point the app was given

    job_page = viewer.get(link)
    assert job_page.status_code == 200
    assert "metrics.json</a> (12 bytes)" in job_page.text
    assert "&lt;i&gt;&amp;&quot;x&#x27;.txt" in job_page.text and NASTY not in job_page.text
    assert "id='cancel'" not in job_page.text  # a finished job has no cancel button
    log = viewer.get(f"/kinetic/api/jobs/{done['job_id']}/log", params={**q, "offset": 0}).json()
    assert log["terminal"] is True and log["state"] == "SUCCEEDED"
    assert "line 2 <script>alert(2)</script>" in log["text"]  # JSON; the page uses textContent
    more = viewer.get(
        f"/kinetic/api/jobs/{done['job_id']}/log",
        params={**q, "offset": log["offset"]},
    ).json()
    assert more["text"] == "" and more["offset"] == log["offset"]

    file = viewer.get(
        f"/kinetic/jobs/{done['job_id']}/files",
        params={**q, "name": "metrics.json"},
    )
    assert file.status_code == 200 and file.json() == {"ok": True}
    assert file.headers["content-disposition"].startswith("attachment")
    escape = viewer.get(
        f"/kinetic/jobs/{done['job_id']}/files",
        params={**q, "name": "../../handle.json"},
    )
    assert escape.status_code == 400
    assert viewer.get("/kinetic/jobs/job-nope", params=q).status_code == 404
    assert viewer.get("/kinetic/jobs/..%2Fx", params=q).status_code in (400, 404)

    # A running job's Cancel button only for whom the cancel POST would not refuse:
    # a viewer (GET on task instances, no PUT) sees the page without it.
    running_page = viewer.get(f"/kinetic/jobs/{running['job_id']}", params=q)
    assert running_page.status_code == 200 and "data-terminal='false'" in running_page.text
    assert "id='cancel'" not in running_page.text
    assert "id='cancel'" in admin.get(f"/kinetic/jobs/{running['job_id']}", params=q).text
    cancel = f"/kinetic/jobs/{running['job_id']}/cancel"
    header = {"X-Kinetic-Action": "cancel"}
    # A viewer may read but not cancel; a plain form post (no header) is refused too.
    assert viewer.post(cancel, params=q, headers=header).status_code == 403
    assert admin.post(cancel, params=q).status_code == 400
    cross = {**header, "Origin": "https://evil.example"}
    assert admin.post(cancel, params=q, headers=cross).status_code == 403
    assert attach(running["job_id"], conn_id=conn).status().status.value in ("PENDING", "RUNNING")
    resp = admin.post(cancel, params=q, headers=header)
    assert resp.status_code == 200 and resp.json()["cancel_requested"] is True
    report = attach(running["job_id"], conn_id=conn).status()  # cancel waits for the kill
    assert report.status.value == "FAILED" and report.reason == "cancelled"

    group = viewer.get("/kinetic/", params={**q, "group": "grp-none"})
    assert "id='no-jobs'" in group.text and "<tr data-job-id" not in group.text


def leaves_links(secret: str, secret_dir: str) -> int:
    import os

    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.json"), "w") as f:
        f.write('{"ok": true}')
    os.symlink(secret, os.path.join(out, "passwd"))  # a file outside the store
    os.symlink(secret_dir, os.path.join(out, "etc"))  # a directory outside the store
    os.symlink("metrics.json", os.path.join(out, "alias.json"))  # a file inside it
    return 1


def test_a_viewer_cannot_download_through_a_link_out_of_the_store(conn, clients, tmp_path: Path):
    """Issue 38, case 1: a job leaves links in its output dir; a viewer's download of
    one that leads outside the store is refused (403, the secret nowhere in the
    answer) and the job page does not list it; a link to a file inside is served."""
    secret_dir = tmp_path / "server-etc"
    secret_dir.mkdir()
    (secret_dir / "passwd").write_text("root:SECRET-OUTSIDE-THE-STORE\n")
    done = submit(conn, leaves_links, str(secret_dir / "passwd"), str(secret_dir))
    assert attach(done["job_id"], conn_id=conn).result(timeout=120, poll_interval=0.05) == 1
    _, viewer, _ = clients
    q, files = {"conn_id": conn}, f"/kinetic/jobs/{done['job_id']}/files"
    for name in ("passwd", "etc/passwd"):
        resp = viewer.get(files, params={**q, "name": name})
        assert resp.status_code == 403, (name, resp.status_code, resp.text)
        assert "SECRET" not in resp.text and str(secret_dir) not in resp.text
    alias = viewer.get(files, params={**q, "name": "alias.json"})
    assert alias.status_code == 200 and alias.json() == {"ok": True}
    page = viewer.get(f"/kinetic/jobs/{done['job_id']}", params=q)
    assert page.status_code == 200
    assert "alias.json</a>" in page.text and "metrics.json</a>" in page.text
    assert "passwd</a>" not in page.text


def train(steps: int) -> int:
    return steps * 2


def usage_cells(page: str, job_id: str) -> dict[str, tuple[str, str | None]]:
    """A list row's usage cells: ``{column: (text, data-value or None)}``."""
    (cells,) = re.findall(rf"<tr data-job-id='{job_id}'>(.*?)</tr>", page)
    found = re.findall(r"data-usage='([^']+)'(?: data-value='([^']+)')?>([^<]*)</td>", cells)
    return {name: (text, value or None) for name, value, text in found}


def test_usage_on_the_list_and_the_job_page_with_a_price_table(
    conn, clients, tmp_path: Path, monkeypatch
):
    """A TPU job the local backend ran: chip-hours and queued time from its runner's
    start record and result, the same on the list and on its page; the estimated cost
    only once a price table is set; a capacity from the (unsigned) history escaped."""
    from airflow_provider_kinetic.core.jobs import history
    from airflow_provider_kinetic.core.jobs.checkpoint import read_started
    from airflow_provider_kinetic.core.storage import LocalStore

    _, viewer, _ = clients
    ti = FakeTI(task_id="train")
    op = KineticRunOperator(task_id="train", python_callable=train, op_args=[3],
                            accelerator="tpu-v6e-8", kinetic_conn_id=conn,
                            wait_for_completion=False)  # fmt: skip
    job_id = op.execute({"ti": ti})["job_id"]
    assert attach(job_id, conn_id=conn).result(timeout=120, poll_interval=0.05) == 6
    store = LocalStore(str(tmp_path / "kinetic"))
    start = read_started(store, f"{job_id}/")["started_at"]
    run_s = round((tmp_path / "kinetic" / job_id / "result.pkl.sig").stat().st_mtime - start, 3)
    submitted = history.iso_epoch(history.read(store, job_id)["submitted_at"])
    evil = "<img src=x onerror=alert(1)>"
    history.submitted(store, "job-evil", {"dag_id": "d", "task_id": "t", "run_id": "r"},
                      backend="local", accelerator="tpu-v6e-8", func="f", output_dir=None,
                      capacity=evil)  # fmt: skip
    history.update(store, "job-evil", "FAILED")
    q = {"conn_id": conn}

    page = viewer.get("/kinetic/", params=q).text
    assert "<th>Est. cost</th>" not in page  # no price table: no cost anywhere
    cells = usage_cells(page, job_id)
    assert cells["capacity"] == ("on-demand", None)
    assert float(cells["chip-hours"][1]) == 8 * run_s / 3600
    assert float(cells["run"][1]) == run_s
    assert float(cells["queued"][1]) == round(start - submitted, 3)
    assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert usage_cells(page, "job-evil")["run"] == ("unknown", None)  # nobody saw it start

    job_page = viewer.get(f"/kinetic/jobs/{job_id}", params=q).text
    line = re.search(r"<span id='usage'>([^<]*)</span>", job_page).group(1)
    assert re.fullmatch(r"tpu-v6e-8 on on-demand: \S+ chip-hours over 1 attempt, \d+ s queued",
                        line), line  # fmt: skip
    assert "Est. cost" not in job_page

    prices = tmp_path / "prices.csv"
    prices.write_text("accelerator,capacity,usd_per_chip_hour\nv6e,on-demand,2.5\n")
    monkeypatch.setenv("AIRFLOW__KINETIC__PRICE_TABLE", str(prices))
    page = viewer.get("/kinetic/", params=q).text
    assert "<th>Est. cost</th>" in page
    text, value = usage_cells(page, job_id)["est. cost"]
    assert float(value) == round(8 * run_s / 3600 * 2.5, 4) and text.startswith("$")
    job_page = viewer.get(f"/kinetic/jobs/{job_id}", params=q).text
    assert re.search(r"<span id='usage'>[^<]*, est\. \$\d+\.\d\d</span>", job_page)
    prices.write_text("accelerator,capacity,usd_per_chip_hour\nv6e,on-demand,cheap\n")
    page = viewer.get("/kinetic/", params=q)  # a bad table: the page still shows, no cost
    assert page.status_code == 200 and "<th>Est. cost</th>" not in page.text
