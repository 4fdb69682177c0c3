"""The Airflow UI in a real browser: the Kinetic page, the connection form, deferred tasks.

Headless Chromium from Debian's ``chromium`` package (``scripts/install-browser.sh``)
driven by Playwright's Python client, against one real ``airflow standalone`` shared
by the module (its DAGs: ``tests/dags/kinetic_browser_dags.py``), signed in through
the UI's own login form (as admin; one test also as a viewer).  Without
``/usr/bin/chromium`` the module is skipped, unless ``KINETIC_REQUIRE_BROWSER`` is set
(CI), where that is a failure.

Screenshots are kept as test artifacts: PNGs under ``$KINETIC_TEST_ARTIFACTS`` or,
by default, ``test-artifacts/`` at the repository root (git-ignored) - the one place
these tests write outside temporary directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.registry import backend_kinds
from airflow_provider_kinetic.provider_info import FORM
from tests.fixtures.standalone import REPO, RUN_DEADLINE_S, USERS, Standalone, run_standalone

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(os.environ.get("KINETIC_TEST_ARTIFACTS") or REPO / "test-artifacts")
DAGS = REPO / "tests" / "dags" / "kinetic_browser_dags.py"
BATCH_DAGS = REPO / "tests" / "dags" / "kinetic_browser_batch_dags.py"
BATCH_DAG, BATCH_RUN, BATCH_TASK = "kinetic_browser_batch", "browser_batch", "sweep"
DONE_DAG, DONE_RUN, DONE_TASK = "kinetic_browser_done", "browser_done", "greet"
SLOW_DAG, SLOW_RUN, SLOW_TASK = "kinetic_browser_deferred", "browser_deferred", "slow"
UI_TIMEOUT_MS = 60_000  # a 2-core CI machine runs standalone and the browser together
VIEWER_RUN = "browser_viewer"


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"browser-{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def playwright_api() -> Iterator[Any]:
    """Playwright, once Debian's Chromium is known to be there (never downloaded)."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing: run scripts/install-browser.sh"
        if os.environ.get("KINETIC_REQUIRE_BROWSER"):
            pytest.fail(reason + " (KINETIC_REQUIRE_BROWSER is set)")
        pytest.skip(reason)
    from playwright.sync_api import expect, sync_playwright

    # expect() has its own timeout (5 s), apart from the contexts' default
    expect.set_options(timeout=UI_TIMEOUT_MS)
    with sync_playwright() as api:
        yield api


@pytest.fixture(scope="module")
def server(playwright_api, tmp_path_factory) -> Iterator[Standalone]:
    """One standalone for the module, with the finished run the link test opens."""
    with run_standalone(
        tmp_path_factory.mktemp("browser"), DAGS, extra_dag_files=[BATCH_DAGS], env=USERS
    ) as s:
        s.unpause(DONE_DAG)
        s.unpause(SLOW_DAG)
        s.trigger(DONE_DAG, DONE_RUN)
        assert s.wait_finished(DONE_DAG, DONE_RUN) == "success"
        yield s


@contextlib.contextmanager
def signed_in(playwright_api: Any, server: Standalone, username: str) -> Iterator[Any]:
    """A browser context signed in as ``username`` through the UI's login form."""
    browser = playwright_api.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    ctx = browser.new_context(
        base_url=str(server.client.base_url), viewport={"width": 1400, "height": 1000}
    )
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    password = json.loads(server.passwords_file.read_text())[username]
    page = ctx.new_page()
    page.goto("/auth/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/$"))
    page.close()
    try:
        yield ctx
    finally:
        ctx.close()
        browser.close()


@pytest.fixture(scope="module")
def context(playwright_api, server) -> Iterator[Any]:
    """A browser context signed in as admin."""
    with signed_in(playwright_api, server, "admin") as ctx:
        yield ctx


@pytest.fixture
def page(context) -> Iterator[Any]:
    page = context.new_page()
    try:
        yield page
    finally:
        page.close()


def xcom(s: Standalone, dag_id: str, run_id: str, task_id: str, key: str) -> Any:
    path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
    resp = s.api("GET", path, params={"deserialize": True, "stringify": False})
    assert resp.status_code == 200, resp.text
    return resp.json()["value"]


def test_task_link_opens_the_kinetic_page_with_the_job_and_its_log(server, page):
    from playwright.sync_api import expect

    job_id = xcom(server, DONE_DAG, DONE_RUN, DONE_TASK, "kinetic_job")["job_id"]
    page.goto(f"/dags/{DONE_DAG}/runs/{DONE_RUN}/tasks/{DONE_TASK}")
    page.get_by_text("Details", exact=True).first.click()
    link = page.get_by_role("link", name="Kinetic job")
    expect(link).to_have_attribute("href", f"/kinetic/jobs/{job_id}")
    shot(page, "ti-finished")

    link.click()
    page.wait_for_url(f"**/kinetic/jobs/{job_id}")
    expect(page.locator("h1")).to_have_text(f"Kinetic job {job_id}")
    expect(page.locator("#state")).to_have_text("SUCCEEDED")
    expect(page.locator("#log")).to_have_attribute("data-complete", "true")
    log = page.locator("#log").inner_text()
    assert [f"kinetic browser line {i}" in log for i in range(5)] == [True] * 5, log
    expect(page.locator("#files")).to_contain_text("summary.txt")
    expect(page.locator("#cancel")).to_have_count(0)  # nothing to cancel once finished
    # Its usage: the task log's line (a CPU job counts hours, not chip-hours).
    expect(page.locator("#usage")).to_have_text(
        re.compile(r"^cpu on on-demand: \S+ hours over 1 attempt, .* queued")
    )
    shot(page, "kinetic-job")

    page.get_by_role("link", name="All kinetic jobs").click()
    row = page.locator(f"tr[data-job-id='{job_id}']")
    expect(row).to_contain_text("SUCCEEDED")
    expect(row).to_contain_text(f"{DONE_DAG} / {DONE_RUN} / {DONE_TASK}")
    expect(row.locator("td").nth(2)).to_have_text("cpu")
    expect(row.locator("td").nth(3)).to_have_text("local")
    expect(row.locator("td").nth(6)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\dT.*Z$"))
    expect(row.locator("td[data-usage='capacity']")).to_have_text("on-demand")
    expect(row.locator("td[data-usage='chip-hours']")).to_have_text("no chips")
    shot(page, "kinetic-jobs")

    # The same list inside the UI: the plugin's Browse entry (an external view).
    page.goto("/plugin/kinetic")
    frame_row = page.frame_locator("iframe").locator(f"tr[data-job-id='{job_id}']")
    expect(frame_row).to_contain_text("SUCCEEDED")
    shot(page, "kinetic-in-ui")


def test_kinetic_connection_form_shows_every_field_of_provider_info(server, page):
    from playwright.sync_api import expect

    page.goto("/connections")
    page.get_by_role("button", name="Add Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("combobox").first.fill("Kinetic")
    page.keyboard.press("Enter")
    dialog.get_by_text("Extra Fields", exact=True).click()
    expect(dialog.locator("[name=element_bucket]")).to_be_visible()

    for name, (label, kind, _placeholder, description) in FORM.items():
        field = dialog.locator(f"[name=element_{name}]")
        expect(field).to_have_count(1)
        expect(dialog.get_by_text(label, exact=True)).to_have_count(1)
        expect(dialog.get_by_text(description, exact=True)).to_be_visible()
        if kind == "boolean":
            expect(field).to_have_attribute("type", "checkbox")
    for name in ("gcp_conn_id", "impersonation_chain", "schedule_timeout_s", "create_grace_s"):
        expect(dialog.locator(f"[name=element_{name}]")).to_be_editable()

    dialog.locator("#element_backend [role=combobox]").click()
    options = page.get_by_role("option")
    expect(options.first).to_be_visible()
    shown = [text.strip() for text in options.all_inner_texts()]
    assert [kind for kind in shown if kind != "null"] == list(backend_kinds()), shown
    shot(page, "connection-form")


def test_deferred_task_page_shows_deferred_and_the_job_link(server, page):
    from playwright.sync_api import expect

    server.trigger(SLOW_DAG, SLOW_RUN)
    ti_path = f"/dags/{SLOW_DAG}/dagRuns/{SLOW_RUN}/taskInstances/{SLOW_TASK}"

    def deferred() -> bool:
        resp = server.api("GET", ti_path)
        return resp.status_code == 200 and resp.json()["state"] == "deferred"

    server.wait_for("the slow task to defer", deferred, RUN_DEADLINE_S)
    job_id = xcom(server, SLOW_DAG, SLOW_RUN, SLOW_TASK, "kinetic_job")["job_id"]
    # The Kinetic tab: the progress its function reports, a bar and its text, live.
    task_url = f"/dags/{SLOW_DAG}/runs/{SLOW_RUN}/tasks/{SLOW_TASK}"
    page.goto(task_url)
    page.get_by_role("link", name="Kinetic", exact=True).click()
    page.wait_for_url(f"**{task_url}/plugin/kinetic-task")
    frame = page.frame_locator("iframe")
    text = frame.locator("#progress .progress-text")
    expect(text).to_contain_text(re.compile(r"step \d+/30 \(\d+%\), ETA .*, tick \d+"),
                                 timeout=RUN_DEADLINE_S * 1000)  # fmt: skip
    expect(frame.locator("#progress progress")).to_be_visible()
    shot(page, "kinetic-tab-progress")
    page.goto(task_url)
    page.get_by_text("Details", exact=True).first.click()
    state_row = page.locator("tr", has=page.get_by_text("State", exact=True)).first
    expect(state_row).to_contain_text("deferred")
    link = page.get_by_role("link", name="Kinetic job")
    expect(link).to_have_attribute("href", f"/kinetic/jobs/{job_id}")
    shot(page, "ti-deferred")

    # The live page of the running job: its log grows, and its cancel button ends it
    # (which also ends the job before standalone goes away).
    link.click()
    page.wait_for_url(f"**/kinetic/jobs/{job_id}")
    expect(page.locator("#state")).to_have_text("RUNNING")
    expect(page.locator("#log")).to_contain_text("slow tick 1")
    expect(page.locator("#progress .progress-text")).to_contain_text(" ETA ")  # the job page's
    shot(page, "kinetic-job-running")
    page.once("dialog", lambda d: d.accept())
    page.locator("#cancel").click()
    expect(page.locator("#cancel-result")).to_have_text("cancel requested")
    expect(page.locator("#state")).to_have_text("FAILED (cancelled)")
    expect(page.locator("#log")).to_have_attribute("data-complete", "true")
    assert server.wait_finished(SLOW_DAG, SLOW_RUN) == "failed"
    assert server.json(ti_path)["state"] == "failed"


def test_a_viewer_sees_the_running_job_without_a_cancel_button(playwright_api, server, page):
    """Signed in as a viewer (may read task instances, not change them) the live page of
    a running job shows its state and log but no Cancel button, which would only
    answer 403; the admin's page of the same job has it."""
    from playwright.sync_api import expect

    # A logical date of its own: the deferred test's run of this DAG has the default one.
    body = {"dag_run_id": VIEWER_RUN, "logical_date": "2026-11-16T00:00:00Z", "conf": {}}
    resp = server.api("POST", f"/dags/{SLOW_DAG}/dagRuns", json=body)
    assert resp.status_code == 200, resp.text
    ti_path = f"/dags/{SLOW_DAG}/dagRuns/{VIEWER_RUN}/taskInstances/{SLOW_TASK}"

    def deferred() -> bool:
        resp = server.api("GET", ti_path)
        return resp.status_code == 200 and resp.json()["state"] == "deferred"

    server.wait_for("the slow task to defer", deferred, RUN_DEADLINE_S)
    job_id = xcom(server, SLOW_DAG, VIEWER_RUN, SLOW_TASK, "kinetic_job")["job_id"]
    with signed_in(playwright_api, server, "viewer") as viewer:
        mine = viewer.new_page()
        mine.goto(f"/kinetic/jobs/{job_id}")
        expect(mine.locator("h1")).to_have_text(f"Kinetic job {job_id}")
        expect(mine.locator("#state")).to_have_text("RUNNING")
        expect(mine.locator("#log")).to_contain_text("slow tick 1")
        expect(mine.locator("#cancel")).to_have_count(0)
        shot(mine, "kinetic-job-viewer")
    page.goto(f"/kinetic/jobs/{job_id}")  # the admin's page: the button, which ends it
    expect(page.locator("#state")).to_have_text("RUNNING")
    page.once("dialog", lambda d: d.accept())
    page.locator("#cancel").click()
    expect(page.locator("#cancel-result")).to_have_text("cancel requested")
    assert server.wait_finished(SLOW_DAG, VIEWER_RUN) == "failed"


def test_the_kinetic_tab_of_a_map_task_shows_children_and_live_logs(server, page):
    """The task instance's Kinetic tab (the plugin's ``task_instance`` external view,
    listed by ``/api/v2/plugins``), inside Airflow's page: the batch's children with
    their states, a running child's log growing, another child's log by its row's
    link, and every child succeeded at the end without a reload."""
    from playwright.sync_api import expect

    views = {
        view["url_route"]: view
        for plugin in server.json("/plugins")["plugins"]
        if plugin["name"] == "kinetic"
        for view in plugin["external_views"]
    }
    assert views["kinetic-task"]["destination"] == "task_instance"
    server.unpause(BATCH_DAG)
    server.trigger(BATCH_DAG, BATCH_RUN)
    ti_path = f"/dags/{BATCH_DAG}/dagRuns/{BATCH_RUN}/taskInstances/{BATCH_TASK}"
    server.wait_for(
        "the map task to run",
        lambda: server.api("GET", ti_path).json().get("state") == "running",
        RUN_DEADLINE_S,
    )
    # The tab itself (the plugin's page, signed in by the REST client's token) lists
    # the children once the batch has launched them.
    tab_page = f"/kinetic/ti/{BATCH_DAG}/{BATCH_RUN}/{BATCH_TASK}/-1"
    server.wait_for(
        "the batch's children on the tab",
        lambda: server.client.get(tab_page).text.count("<tr data-child=") == 3,
        RUN_DEADLINE_S,
    )
    tab_url = f"/dags/{BATCH_DAG}/runs/{BATCH_RUN}/tasks/{BATCH_TASK}"
    page.goto(tab_url)
    page.get_by_role("link", name="Kinetic", exact=True).click()
    page.wait_for_url(f"**{tab_url}/plugin/kinetic-task")
    frame = page.frame_locator("iframe")
    expect(frame.locator("tr[data-child]")).to_have_count(3)
    expect(frame.locator("h1")).to_have_text(f"Kinetic: {BATCH_DAG} / {BATCH_RUN} / {BATCH_TASK}")
    expect(frame.locator(".batch-state")).to_have_text(re.compile(r"^RUNNING"))
    expect(frame.locator("#log")).to_contain_text("batch child 0 line 1")
    expect(frame.locator("#log")).to_contain_text("batch child 0 line 3")  # it grows
    # The batch's progress: children done of total and each running child's step, as
    # the task log's batch line says it, refreshed with the children.
    running = re.compile(r"^0/3 children done \(0%\); child 0 step \d+/25 \(\d+%\)")
    expect(frame.locator(".batch-progress .progress-text")).to_have_text(running)
    expect(frame.locator("tr[data-child='1'] .step")).to_have_text(re.compile(r"^step \d+/25 "))
    shot(page, "kinetic-tab-running")

    frame.locator("tr[data-child='1'] a.log-link").click()
    expect(frame.locator("#log-title")).to_contain_text("Log of child 1")
    expect(frame.locator("#log")).to_contain_text("batch child 1 line 2")
    for index in range(3):
        state = frame.locator(f"tr[data-child='{index}'] .state")
        expect(state).to_have_text("SUCCEEDED", timeout=RUN_DEADLINE_S * 1000)
    expect(frame.locator(".batch-state")).to_have_text(re.compile(r"^SUCCEEDED"))
    expect(frame.locator(".batch-progress .progress-text")).to_have_text("3/3 children done (100%)")
    expect(frame.locator(".batch-progress progress")).to_have_js_property("value", 1)
    expect(frame.locator("#log")).to_have_attribute("data-complete", "true")
    assert server.wait_finished(BATCH_DAG, BATCH_RUN) == "success"
    shot(page, "kinetic-tab-done")


def test_the_keys_page_lists_keys_with_versions_and_who_wrote_them(server, page, tmp_path):
    from playwright.sync_api import expect

    from airflow_provider_kinetic.core.keys.keystore import KeyStore
    from airflow_provider_kinetic.core.storage import LocalStore

    store = LocalStore(str(server.home / "kinetic"))  # the standalone's default store
    by_task = {"dag_id": "train_dag", "run_id": "r<1>", "task_id": "train", "map_index": -1}
    put = KeyStore(store, who=lambda: dict(by_task, job_id="job-0001")).put
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "w.bin").write_bytes(b"x" * 2048)
    first = put("browser/model", tmp_path / "v1")
    (tmp_path / "v1" / "more.txt").write_text("second")
    second = put("browser/model", tmp_path / "v1")
    (tmp_path / "notes.txt").write_text("n")
    by_user = {"user": "ana", "host": "laptop"}
    other = KeyStore(store, who=lambda: by_user).put("browser/notes", tmp_path / "notes.txt")

    page.goto("/kinetic/")
    page.locator("#keys-link").click()
    page.wait_for_url("**/kinetic/keys")
    rows = page.locator("#keys tbody tr[data-key='browser/model']")
    expect(rows).to_have_count(2)
    newest, oldest = rows.nth(0), rows.nth(1)
    expect(newest).to_have_attribute("data-version", second["version"])
    expect(newest).to_have_attribute("data-current", "true")
    expect(newest.locator("td").nth(0)).to_contain_text("browser/model")
    expect(newest.locator("td").nth(0)).to_contain_text("2 version(s)")
    expect(newest.locator("td").nth(1)).to_have_text(f"{second['version'][:12]} (current)")
    expect(newest.locator("td").nth(2)).to_have_text(second["time"])
    expect(newest.locator("td").nth(3)).to_have_attribute("data-bytes", str(2048 + 6))
    expect(newest.locator("td").nth(4)).to_have_text("2")
    expect(newest.locator("td.by")).to_have_text("train_dag / r<1> / train; job job-0001")
    expect(oldest).to_have_attribute("data-version", first["version"])
    expect(oldest.locator("td").nth(4)).to_have_text("1")
    expect(oldest.locator("td").nth(3)).to_have_attribute("data-bytes", "2048")
    notes = page.locator("#keys tbody tr[data-key='browser/notes']")
    expect(notes).to_have_attribute("data-version", other["version"])
    expect(notes.locator("td.by")).to_have_text("ana@laptop")
    shot(page, "kinetic-keys")
    # A prefix narrows the list; one not of the key form is refused, naming it.
    page.goto("/kinetic/keys?prefix=browser/notes")
    expect(page.locator("#keys tbody tr")).to_have_count(1)
    assert page.goto("/kinetic/keys?prefix=../x").status == 400
