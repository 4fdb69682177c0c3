"""The Kinetic plugin: a same-origin "Kinetic" page on the Airflow 3 API server.

Registered through the ``airflow.plugins`` entry point.  ``fastapi_apps`` mounts the
pages at ``/kinetic`` (the job link of jobs without a web console points there) and
``external_views`` puts a "Kinetic" entry in the UI's Browse menu that shows the
jobs list inside the UI (``url_route``) and a "Kinetic" tab on each task instance
(``destination: "task_instance"``) showing that task's job or batch.  Both
interfaces exist since Airflow 3.1 (``fastapi_apps`` since 3.0); Airflow 2 has
neither, and there the plugin is empty.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

# Where the pages are mounted (``links`` builds the job links from the same constant).
# Nothing heavy is imported here: every Airflow process loads plugins.
from airflow_provider_kinetic.provider_info import PLUGIN_PREFIX

__all__ = ["PLUGIN_PREFIX", "TASK_TAB_HREF", "KineticPlugin"]


class _LazyApps:
    """``fastapi_apps``, built on first read: every Airflow process loads plugins
    (scheduler, workers, triggerer), but only the API server reads this, and building
    the app imports the API server's security modules (seconds of imports)."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, obj: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            try:
                from airflow_provider_kinetic.plugins.app import create_app
            except ImportError:  # pragma: no cover - no FastAPI API server (Airflow 2)
                self._apps = []
            else:
                self._apps = [{"app": create_app(), "url_prefix": PLUGIN_PREFIX, "name": "Kinetic"}]
        return self._apps


#: The task instance tab's URL.  Airflow's UI fills in ``{DAG_ID}``, ``{RUN_ID}``,
#: ``{TASK_ID}`` and ``{MAP_INDEX}`` in the ``href`` of an external view whose
#: ``destination`` is not ``"nav"`` (``ExternalViewResponse`` in
#: ``airflow/api_fastapi/core_api/datamodels/plugins.py`` lists the destinations:
#: nav, dag, dag_run, task, task_instance, base; the UI's plugin view does the
#: ``replaceAll``).  3.1 puts the ids in raw, 3.3 percent-encodes them: so they go in
#: the path, where a raw ``+`` or ``:`` of a run id stays itself (in a query string
#: ``+`` would read as a space), and the route reads the run id as whatever lies
#: between the dag id and the last two segments.  ``{MAP_INDEX}`` is left as it is
#: for a task that is not mapped (the route has no map index): the page reads it as
#: -1.  A tab needs a ``url_route`` (its route is ``.../plugin/{url_route}``), unique
#: across plugins.
TASK_TAB_HREF = PLUGIN_PREFIX + "/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}"


class KineticPlugin(AirflowPlugin):
    """Mounts the Kinetic pages, adds the jobs list to the UI's Browse menu and a
    Kinetic tab to every task instance (a task without kinetic jobs shows none)."""

    name = "kinetic"
    fastapi_apps = _LazyApps()  # type: ignore[assignment]  # reads as the list
    external_views = [
        # "nav" with a url_route: the page inside the UI's layout (an iframe at
        # /plugin/kinetic, in 3.1 as in 3.3), under Browse ("category").
        {
            "name": "Kinetic",
            "href": PLUGIN_PREFIX + "/",
            "category": "browse",
            "url_route": "kinetic",
            "destination": "nav",
        },
        {
            "name": "Kinetic",
            "href": TASK_TAB_HREF,
            "url_route": "kinetic-task",
            "destination": "task_instance",
        },
    ]
