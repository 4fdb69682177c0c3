"""Operator extra links: the GKE console page of the job (or the local job dir).

On Airflow 3 links are XCom-backed: the operator pushes the final URL under the
link's ``xcom_key`` as soon as the job exists, so the UI shows it while the job
runs (the worker would otherwise only push it when the task ends).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.handles import JobHandle


def job_url(handle: JobHandle | dict[str, Any]) -> str:
    """Where a person looks at the job: its backend says (GKE console, local dir)."""
    handle = JobHandle.from_dict(handle)
    return backend_class(handle.backend).console_url(handle)


class KineticJobLink(BaseOperatorLink):
    """ "Kinetic job" button on the task."""

    name = "Kinetic job"

    @property
    def xcom_key(self) -> str:
        return "kinetic_job_link"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        url = XCom.get_value(key=self.xcom_key, ti_key=ti_key)
        return url or ""
