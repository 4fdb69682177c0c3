"""The Kinetic plugin: a same-origin "Kinetic" page on the Airflow 3 API server.

Registered through the ``airflow.plugins`` entry point.  ``fastapi_apps`` mounts the
pages at ``/kinetic`` (the job link of jobs without a web console points there) and
``external_views`` puts a "Kinetic" entry in the UI's Browse menu that shows the
jobs list inside the UI (``url_route``).  Both interfaces exist since Airflow 3.1
(``fastapi_apps`` since 3.0); Airflow 2 has neither, and there the plugin is empty.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

# Where the pages are mounted (``links`` builds the job links from the same constant).
# Nothing heavy is imported here: every Airflow process loads plugins.
from airflow_provider_kinetic.provider_info import PLUGIN_PREFIX

__all__ = ["PLUGIN_PREFIX", "KineticPlugin"]


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


class KineticPlugin(AirflowPlugin):
    """Mounts the Kinetic pages and adds them to the UI's Browse menu."""

    name = "kinetic"
    fastapi_apps = _LazyApps()  # type: ignore[assignment]  # reads as the list
    external_views = [
        {
            "name": "Kinetic",
            "href": PLUGIN_PREFIX + "/",
            "category": "browse",
            "url_route": "kinetic",
            "destination": "nav",
        }
    ]
