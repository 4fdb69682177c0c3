"""Operator extra links: the job's console page, its logs, its output dir, its batch.

On Airflow 3 links are XCom-backed: the operator pushes the final URL under the
link's ``xcom_key`` as soon as the job exists, so the UI shows it while the job
runs (the worker would otherwise only push it when the task ends).  The URLs come
from the job's backend (``console_url``, ``logs_url``, ``group_logs_url``); a link
with no URL for a backend (the local backend has no Cloud Logging) is not pushed.

A backend without a web console of its own (the local backend: its ``console_url``
is a ``file://`` directory, which the Airflow UI refuses to render as a link) gets
the same-origin Kinetic page of this provider's plugin instead
(``/kinetic/jobs/{job_id}``, under the API server's base URL path).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from airflow.configuration import conf
from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

from airflow_provider_kinetic.core.backends.k8s.console import storage_browser_url
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.provider_info import PLUGIN_PREFIX

DEFAULT_CONN_ID = "kinetic_default"


def _is_web_url(url: str | None) -> bool:
    return bool(url) and url.startswith(("https://", "http://"))


def plugin_url(path: str, conn_id: str = DEFAULT_CONN_ID) -> str:
    """A same-origin URL of a Kinetic page: the API server's base URL path (a
    deployment served under ``/airflow`` must link to ``/airflow/kinetic/...``) +
    ``/kinetic/`` + ``path``; ``conn_id`` only when it is not the default."""
    base = urllib.parse.urlsplit(conf.get("api", "base_url", fallback="") or "").path
    url = base.rstrip("/") + PLUGIN_PREFIX + "/" + path.lstrip("/")
    if conn_id != DEFAULT_CONN_ID:
        sep = "&" if "?" in url else "?"
        url += sep + urllib.parse.urlencode({"conn_id": conn_id})
    return url


def job_url(handle: JobHandle | dict[str, Any], conn_id: str = DEFAULT_CONN_ID) -> str:
    """Where a person looks at the job: its backend's web console (GKE), else the
    Kinetic page (a ``file://`` directory is not a page the UI can open)."""
    handle = JobHandle.from_dict(handle)
    url = backend_class(handle.backend).console_url(handle)
    if _is_web_url(url):
        return url
    return plugin_url("jobs/" + urllib.parse.quote(handle.job_id, safe=""), conn_id)


def batch_url(
    backend: str,
    group_id: str,
    project: str,
    cluster: str,
    namespace: str,
    conn_id: str = DEFAULT_CONN_ID,
) -> str:
    """Where a person looks at a whole batch: the backend's log page for every child
    (GKE), else the Kinetic jobs list filtered to the batch."""
    url = backend_class(backend).group_logs_url(group_id, project, cluster, namespace)
    if _is_web_url(url):
        return url  # type: ignore[return-value]  # _is_web_url: not None
    return plugin_url("?" + urllib.parse.urlencode({"group": group_id}), conn_id)


def output_url(uri: str | None, project: str = "") -> str | None:
    """The Cloud Storage browser page of a ``gs://`` output dir (None for others)."""
    return storage_browser_url(uri or "", project)


class _XComLink(BaseOperatorLink):
    """A link whose URL the operator pushed to XCom under ``key``.

    Airflow's task runner asks every link of the running operator for its URL at the
    end of each execution segment (deferral, success, failure) and pushes it under
    ``xcom_key``.  Read from XCom, a link the operator never pushed (the local backend
    has no logs or output page, a task that failed before its job existed has none)
    is an ``[error] XCom not found`` line in the task log; so the running operator's
    ``published_links`` (key -> URL, set in ``execute``) answer instead.  A resumed
    segment has none and reads XCom, where the first segment's push left every key.
    """

    name = ""
    key = ""

    @property
    def xcom_key(self) -> str:
        return self.key

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        published = getattr(operator, "published_links", None)
        if isinstance(published, dict):
            return published.get(self.key) or ""
        return XCom.get_value(key=self.xcom_key, ti_key=ti_key) or ""


class KineticJobLink(_XComLink):
    """The job in the GKE console (a LeaderWorkerSet for multi-host), or its Kinetic page."""

    name, key = "Kinetic job", "kinetic_job_link"


class KineticLogsLink(_XComLink):
    """Cloud Logging, filtered to the job's pods."""

    name, key = "Kinetic logs", "kinetic_logs_link"


class KineticOutputLink(_XComLink):
    """The job's output dir in the Cloud Storage browser."""

    name, key = "Kinetic output", "kinetic_output_link"


class KineticBatchLink(_XComLink):
    """Cloud Logging, filtered to every child of the batch (or the batch's Kinetic page)."""

    name, key = "Kinetic batch", "kinetic_batch_link"


def job_links(handle: JobHandle, conn_id: str = DEFAULT_CONN_ID) -> dict[str, str]:
    """XCom key -> URL of each link this job has."""
    kind = backend_class(handle.backend)
    urls = {
        KineticJobLink.key: job_url(handle, conn_id),
        KineticLogsLink.key: kind.logs_url(handle),
        KineticOutputLink.key: output_url(handle.output_dir, handle.project),
    }
    return {key: url for key, url in urls.items() if url}
