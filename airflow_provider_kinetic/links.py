"""Operator extra links: the job's console page, its logs, its output dir, its batch.

On Airflow 3 links are XCom-backed: the operator pushes the final URL under the
link's ``xcom_key`` as soon as the job exists, so the UI shows it while the job
runs (the worker would otherwise only push it when the task ends).  The URLs come
from the job's backend (``console_url``, ``logs_url``, ``group_logs_url``); a link
with no URL for a backend (the local backend has no Cloud Logging) is not pushed.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

from airflow_provider_kinetic.core.backends.gke import CONSOLE
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.handles import JobHandle


def job_url(handle: JobHandle | dict[str, Any]) -> str:
    """Where a person looks at the job: its backend says (GKE console, local dir)."""
    handle = JobHandle.from_dict(handle)
    return backend_class(handle.backend).console_url(handle)


def output_url(uri: str | None, project: str = "") -> str | None:
    """The Cloud Storage browser page of a ``gs://`` output dir (None for others)."""
    if not uri or not uri.startswith("gs://"):
        return None
    path = urllib.parse.quote(uri[len("gs://") :].rstrip("/") + "/")
    return f"{CONSOLE}/storage/browser/{path}" + (f"?project={project}" if project else "")


class _XComLink(BaseOperatorLink):
    """A link whose URL the operator pushed to XCom under ``key``."""

    name = ""
    key = ""

    @property
    def xcom_key(self) -> str:
        return self.key

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return XCom.get_value(key=self.xcom_key, ti_key=ti_key) or ""


class KineticJobLink(_XComLink):
    """The job in the GKE console (a LeaderWorkerSet for multi-host), or its local dir."""

    name, key = "Kinetic job", "kinetic_job_link"


class KineticLogsLink(_XComLink):
    """Cloud Logging, filtered to the job's pods."""

    name, key = "Kinetic logs", "kinetic_logs_link"


class KineticOutputLink(_XComLink):
    """The job's output dir in the Cloud Storage browser."""

    name, key = "Kinetic output", "kinetic_output_link"


class KineticBatchLink(_XComLink):
    """Cloud Logging, filtered to every child of the batch."""

    name, key = "Kinetic batch", "kinetic_batch_link"


def job_links(handle: JobHandle) -> dict[str, str]:
    """XCom key -> URL of each link this job has."""
    kind = backend_class(handle.backend)
    urls = {
        KineticJobLink.key: kind.console_url(handle),
        KineticLogsLink.key: kind.logs_url(handle),
        KineticOutputLink.key: output_url(handle.output_dir, handle.project),
    }
    return {key: url for key, url in urls.items() if url}
