"""Where a person looks at a GKE job: Google Cloud console and Cloud Logging URLs.

Plain strings, no client: operator links and the CLI import this without paying for
``kubernetes``.
"""

from __future__ import annotations

import urllib.parse

CONSOLE = "https://console.cloud.google.com"


def job_console_url(
    kind: str, zone: str, cluster: str, namespace: str, name: str, project: str
) -> str:
    """The console page of one workload (``kind``: ``job``, ``leaderworkerset``...)."""
    return (
        f"{CONSOLE}/kubernetes/{kind}/{zone}/{cluster}/{namespace}/{name}/details?project={project}"
    )


def logging_url(project: str, cluster: str, namespace: str, label: str, value: str) -> str:
    """A Cloud Logging query URL for the containers whose pods carry ``label=value``."""
    query = "\n".join(
        [
            'resource.type="k8s_container"',
            f'resource.labels.cluster_name="{cluster}"',
            f'resource.labels.namespace_name="{namespace}"',
            f'labels."k8s-pod/{label}"="{value}"',
        ]
    )
    return f"{CONSOLE}/logs/query;query={urllib.parse.quote(query)}?project={project}"


def storage_browser_url(uri: str, project: str = "") -> str | None:
    """The Cloud Storage browser page of a ``gs://`` directory (None for other URIs)."""
    if not uri or not uri.startswith("gs://"):
        return None
    path = urllib.parse.quote(uri[len("gs://") :].rstrip("/") + "/")
    return f"{CONSOLE}/storage/browser/{path}" + (f"?project={project}" if project else "")
