"""KineticHook: a ``kinetic`` connection -> object store + backend.

With no ``kinetic_default`` connection the hook falls back to the embedded local
backend rooted at ``$AIRFLOW_HOME/kinetic``, so a DAG runs on a laptop with no
cloud account; the task log says so.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook, conf

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.local import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.storage import ObjectStore

_EXTRA_FIELDS = (
    "gcp_conn_id",
    "impersonation_chain",
    "endpoint",
    "use_internal_ip",
    "use_dns_endpoint",
    "image_pull_grace_s",
    "schedule_timeout_s",
    "create_grace_s",
    "backend",
    "bucket",
    "root",
    "project",
    "zone",
    "cluster",
    "namespace",
    "image",
    "service_account",
    "runner_command",
)


_NUMBER_FIELDS = ("image_pull_grace_s", "schedule_timeout_s", "create_grace_s")
_BOOL_FIELDS = ("use_internal_ip", "use_dns_endpoint")


def default_local_root() -> str:
    """``$AIRFLOW_HOME/kinetic`` — where the embedded local backend keeps its store."""
    home = os.environ.get("AIRFLOW_HOME") or conf.get("core", "airflow_home", fallback=None)
    return os.path.join(home or os.path.expanduser("~/airflow"), "kinetic")


def config_from_extras(extras: dict[str, Any]) -> KineticConfig:
    """Build a KineticConfig from connection extras (plain or ``extra__kinetic__`` keys)."""
    values: dict[str, Any] = {}
    for name in _EXTRA_FIELDS:
        value = extras.get(name, extras.get(f"extra__kinetic__{name}"))
        if value not in (None, ""):
            values[name] = value
    if isinstance(values.get("runner_command"), str):
        values["runner_command"] = values["runner_command"].split()
    if isinstance(values.get("endpoint"), str):  # the UI stores extras as strings
        values["endpoint"] = json.loads(values["endpoint"])
    for name in _NUMBER_FIELDS:
        if name in values:
            values[name] = _number(name, values[name])
    for name in _BOOL_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = values[name].strip().lower() in ("1", "true", "yes")
    values.setdefault(
        "backend", "gke" if values.get("bucket") or values.get("cluster") else "local"
    )
    if values["backend"] == LocalBackend.name:
        values.setdefault("root", default_local_root())
    return KineticConfig(**values, extra={k: v for k, v in extras.items() if k not in values})


def _number(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"connection extra {name!r} must be a number, got {value!r}") from None


class KineticHook(BaseHook):
    """Resolve where kinetic jobs run and how to reach their store.

    Args:
        kinetic_conn_id: a connection of type ``kinetic``.  Extras: ``backend``
            (local, gke, pathways, auto), ``bucket`` or ``root``, ``project``, ``zone``,
            ``cluster``, ``namespace``, ``image``, ``service_account``.
    """

    conn_name_attr = "kinetic_conn_id"
    default_conn_name = "kinetic_default"
    conn_type = "kinetic"
    hook_name = "Kinetic"

    def __init__(self, kinetic_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kinetic_conn_id = kinetic_conn_id
        self._config: KineticConfig | None = None

    def get_config(self) -> KineticConfig:
        if self._config is None:
            self._config = self._load_config()
        return self._config

    def _load_config(self) -> KineticConfig:
        try:
            conn = self.get_connection(self.kinetic_conn_id)
        except AirflowNotFoundException:
            if self.kinetic_conn_id != self.default_conn_name:
                raise
            root = default_local_root()
            self.log.info(
                "No %r connection: using the embedded local backend (store %s)",
                self.default_conn_name,
                root,
            )
            return KineticConfig(backend=LocalBackend.name, root=root)
        extras = conn.extra_dejson if conn.extra else {}
        return config_from_extras(extras)

    def get_store(self) -> ObjectStore:
        return self.get_config().store()

    def get_backend(self, kind: str | None = None) -> Backend:
        """The backend for ``kind`` (a handle's ``backend``), else the connection's."""
        return backend_for(self.get_config(), kind)

    def get_conn(self) -> KineticConfig:
        return self.get_config()

    def test_connection(self) -> tuple[bool, str]:
        try:
            store = self.get_store()
            store.list("default/data-markers/")
        except Exception as exc:  # noqa: BLE001 - the UI shows the message
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"store {store.uri()} is reachable"


def backend_for(config: KineticConfig, kind: str | None = None) -> Backend:
    """The backend that runs (or ran) a job: ``kind`` is a handle's ``backend``.

    For backends that need a cluster the endpoint is looked up once through
    providers-google and kept in ``config.endpoint``, so trigger kwargs carry it and
    the triggerer needs no second lookup (and no kubeconfig file).
    """
    kind = kind or config.backend
    if kind == registry.AUTO:
        raise ValueError("backend 'auto' needs an accelerator to resolve; use backend_kind()")
    cls = registry.backend_class(kind)
    if not cls.needs_cluster:
        return cls.from_config(config)
    from airflow_provider_kinetic.core.backends.gke import GkeBackend
    from airflow_provider_kinetic.hooks.gke_auth import gke_api_client_factory

    missing = GkeBackend.cluster_fields_missing(config)
    if missing:
        raise ValueError(f"the {kind} backend needs the connection extras {', '.join(missing)}")
    factory = gke_api_client_factory(
        config.project,
        config.zone,
        config.cluster,
        gcp_conn_id=config.gcp_conn_id,
        impersonation_chain=config.impersonation_chain,
        endpoint=config.endpoint,
        use_internal_ip=config.use_internal_ip,
        use_dns_endpoint=config.use_dns_endpoint,
    )
    config.endpoint = factory.endpoint.to_dict()
    return cls.from_config(config, factory)


def config_to_json(config: KineticConfig) -> str:
    """JSON form of a config for trigger kwargs (no objects, no file handles)."""
    return json.dumps(config.to_dict(), sort_keys=True)


def config_from_json(text: str) -> KineticConfig:
    return KineticConfig(**json.loads(text))
