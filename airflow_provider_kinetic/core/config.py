"""Where jobs go: store and backend settings, independent of Airflow connections.

The hook turns a ``kinetic`` connection (or its absence) into a ``KineticConfig``;
core code and tests build one directly.  What a backend kind needs and where its
store lives is asked of the backend registry, not decided here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kinetic.core.accelerators import Accelerator
from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.storage import ObjectStore


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
        # Raises for an unknown kind, listing the registered ones.
        registry.backend_class(registry.store_kind(self.backend)).validate_config(self)

    @property
    def bucket_name(self) -> str:
        """The store root: a bucket, or the local backend's directory."""
        return registry.backend_class(registry.store_kind(self.backend)).bucket_for(self)

    def backend_kind(self, accelerator: Accelerator | None) -> str:
        """The concrete backend for a job (``auto`` resolved by preflight).

        Raises before anything is uploaded when the choice cannot run the job.
        """
        return registry.resolve_kind(self.backend, accelerator)

    def store(self) -> ObjectStore:
        return registry.backend_class(registry.store_kind(self.backend)).store_for(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
