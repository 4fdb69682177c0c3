"""Operator extra links: the GKE console page of the job (or the local job dir).

On Airflow 3 links are XCom-backed: the operator pushes the final URL under the
link's ``xcom_key`` as soon as the job exists, so the UI shows it while the job
runs (the worker would otherwise only push it when the task ends).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

CONSOLE = "https://console.cloud.google.com"


def job_url(handle: dict[str, Any]) -> str:
    """Where a person looks at the job: GKE console for cluster jobs, else its dir."""
    if handle.get("backend") in ("gke", "pathways"):
        kind = "job" if handle["backend"] == "gke" else "leaderworkerset"
        return (
            f"{CONSOLE}/kubernetes/{kind}/{handle['zone']}/{handle['cluster_name']}/"
            f"{handle['namespace']}/{handle['k8s_name']}/details?project={handle['project']}"
        )
    return f"file://{handle['bucket_name']}/{handle['job_id']}/"


class KineticJobLink(BaseOperatorLink):
    """ "Kinetic job" button on the task."""

    name = "Kinetic job"

    @property
    def xcom_key(self) -> str:
        return "kinetic_job_link"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        url = XCom.get_value(key=self.xcom_key, ti_key=ti_key)
        return url or ""
