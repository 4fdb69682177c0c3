"""Job and batch links of backends without a web console: the Kinetic page's URL,
under the API server's base URL path (the UI opens same-origin links in place)."""

from __future__ import annotations

from airflow_provider_kinetic.links import batch_url, job_links, plugin_url
from airflow_provider_kinetic.plugins import PLUGIN_PREFIX, KineticPlugin
from tests.fixtures import records


def test_links_follow_the_base_url_path_and_name_a_non_default_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/team-a/")
    local = records.handle("job-7", "/r")
    assert job_links(local, "kn_b") == {
        "kinetic_job_link": "/team-a/kinetic/jobs/job-7?conn_id=kn_b"
    }
    assert batch_url("local", "grp-2", "", "", "default") == "/team-a/kinetic/?group=grp-2"
    assert plugin_url("?group=g", "kn_b") == "/team-a/kinetic/?group=g&conn_id=kn_b"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://localhost:8080")
    assert job_links(local)["kinetic_job_link"] == "/kinetic/jobs/job-7"


def test_the_plugin_mounts_where_the_links_point():
    assert PLUGIN_PREFIX == "/kinetic"
    nav, tab = KineticPlugin.external_views
    assert nav["href"] == PLUGIN_PREFIX + "/" and nav["url_route"] == "kinetic"
    assert tab["href"].startswith(PLUGIN_PREFIX + "/ti/") and tab["url_route"] == "kinetic-task"
    assert KineticPlugin.name == "kinetic"
