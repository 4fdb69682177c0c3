"""One Google identity: the GCS store uses the credentials of the connection's
``gcp_conn_id`` (and ``impersonation_chain``), through providers-google's
``GoogleBaseHook``, exactly as the GKE side does.

With no such connection the store keeps Application Default Credentials (as
before); with ``STORAGE_EMULATOR_HOST`` set (local rehearsal, tests) the emulator's
anonymous client is kept.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)


def storage_client(config: KineticConfig) -> Any | None:
    """A ``google.cloud.storage.Client`` with the connection's credentials, or None
    when there is no such connection (Application Default Credentials then)."""
    try:
        BaseHook.get_connection(config.gcp_conn_id)
    except AirflowNotFoundException:
        log.debug(
            "no %r connection: the store uses Application Default Credentials", config.gcp_conn_id
        )
        return None
    try:
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    except ImportError as exc:
        raise ImportError(
            f"a GCS store with gcp_conn_id needs apache-airflow-providers-google ({exc}); "
            'install "airflow-provider-kinetic[gke]"'
        ) from exc
    from google.cloud import storage

    hook = GoogleBaseHook(
        gcp_conn_id=config.gcp_conn_id, impersonation_chain=config.impersonation_chain
    )
    credentials, project = hook.get_credentials_and_project_id()
    return storage.Client(credentials=credentials, project=config.project or project)


def store_for(config: KineticConfig) -> ObjectStore:
    """The target's store, authenticated as the connection says (see module docstring)."""
    store = config.store()
    if store.scheme != "gs" or os.environ.get("STORAGE_EMULATOR_HOST"):
        return store
    client = storage_client(config)
    if client is None:
        return store
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    authed = GcsStore(store.bucket, client=client, project=config.project)
    authed.data_layout = config.data_layout
    return authed
