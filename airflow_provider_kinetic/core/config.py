"""Where jobs go: store and backend settings, independent of Airflow connections.

The hook turns a ``kinetic`` connection (or its absence) into a ``KineticConfig``;
core code and tests build one directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

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

    def store(self) -> ObjectStore:
        if self.backend == "local":
            return LocalStore(self.bucket_name)
        return GcsStore(self.bucket_name, project=self.project)
