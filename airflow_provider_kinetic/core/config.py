"""Where jobs go: store and backend settings, independent of Airflow connections.

The hook turns a ``kinetic`` connection (or its absence) into a ``KineticConfig``;
core code and tests build one directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.accelerators import Accelerator
from airflow_provider_kinetic.core.storage import GcsStore, LocalStore, ObjectStore

BACKENDS = ("local", "gke", "pathways", "auto")


@dataclass
class KineticConfig:
    """Settings of one kinetic target (a connection's extras)."""

    backend: str = "local"
    bucket: str | None = None
    root: str | None = None
    project: str | None = None
    zone: str | None = None
    cluster: str | None = None
    namespace: str = "default"
    image: str | None = None
    service_account: str = "kinetic"
    runner_command: list[str] | None = None
    gcp_conn_id: str = "google_cloud_default"
    impersonation_chain: str | list[str] | None = None
    #: {"host", "ca_data"} of the cluster's API server, once discovered (or given).
    endpoint: dict[str, Any] | None = None
    use_internal_ip: bool = False
    use_dns_endpoint: bool = False
    image_pull_grace_s: float = 300.0
    schedule_timeout_s: float | None = 1800.0
    create_grace_s: float = 180.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"unknown kinetic backend {self.backend!r}; allowed: {', '.join(BACKENDS)}"
            )
        if self.backend == "local" and not self.root:
            raise ValueError("the local backend needs a root directory ('root' extra)")

    @property
    def bucket_name(self) -> str:
        """The jobs bucket: explicit, or kinetic's ``{project}-kn-{cluster}-jobs``."""
        if self.backend == "local":
            return os.path.abspath(self.root or "")
        if self.bucket:
            return self.bucket
        if self.project and self.cluster:
            return f"{self.project}-kn-{self.cluster}-jobs"
        raise ValueError("set 'bucket', or 'project' and 'cluster', for a GKE kinetic target")

    def backend_kind(self, accelerator: Accelerator | None) -> str:
        """The concrete backend for a job: ``auto`` = pathways for multi-host TPU, else gke.

        Raises before anything is uploaded when the choice cannot run the job.
        """
        if self.backend == "local":
            return "local"
        multi = accelerator is not None and accelerator.is_multi_host
        if self.backend == "auto":
            return "pathways" if multi else "gke"
        if self.backend == "gke" and multi:
            raise ValueError(
                f"accelerator {accelerator.canonical!r} spans {accelerator.num_nodes} hosts; "
                "a GKE Job runs one pod: use backend 'pathways' or 'auto'"
            )
        return self.backend

    def store(self) -> ObjectStore:
        if self.backend == "local":
            return LocalStore(self.bucket_name)
        return GcsStore(self.bucket_name, project=self.project)
