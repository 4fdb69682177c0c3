"""The backend that runs a job, and the Kubernetes client of its cluster, from a config.

The hook (``KineticHook.get_backend``) and the triggers (which rebuild the backend
from the config's JSON in the triggerer) both come here, so a cluster backend gets
the same client and the same retry policy wherever it is built.  ``kubernetes`` and
the Google clients are imported inside the functions that need them: a DAG file that
imports the provider does not pay for them.

Airflow options (section ``[kinetic]``): ``k8s_api_attempts`` (int, default 5),
``k8s_api_retry_wait_min`` / ``k8s_api_retry_wait_max`` (seconds, default 0.5 / 15),
``k8s_api_retry_after_max`` (seconds, default 30): how Kubernetes API calls that answer
429/5xx or lose their connection are retried
(:mod:`~airflow_provider_kinetic.core.backends.k8s.retry`); ``local_max_jobs`` (int,
default: the machine's CPU count): how many local jobs run at once on the machine
(:mod:`~airflow_provider_kinetic.core.backends.local.slots`); ``local_inherit_env``
(bool, default False): local jobs inherit the worker's whole environment instead of
only its runtime and the captured variables
(:mod:`~airflow_provider_kinetic.core.backends.local.environ`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.backends.local.slots import resolve_max_jobs
from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
from airflow_provider_kinetic.deployment.connection import CONF_SECTION
from airflow_provider_kinetic.deployment.signing import deployment_secret


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
        backend = cls.from_config(config)
        if isinstance(backend, LocalBackend):
            backend.max_jobs = local_max_jobs()
            backend.inherit_env = local_inherit_env()
        return backend
    from airflow_provider_kinetic.core.backends.k8s import pending as k8s_pending
    from airflow_provider_kinetic.core.backends.k8s import queues as k8s_queues

    backend = cls.from_config(config, cluster_client_factory(config, kind))
    backend.retry_policy = k8s_retry_policy()
    # Why a job waits is read at most once a minute per namespace of a cluster, however
    # many backends this process makes for it (a page poll makes one per read).
    seen_by = (config.project, config.zone, config.cluster, str(config.endpoint),
               config.gcp_conn_id, str(config.impersonation_chain))  # fmt: skip
    backend._why_seen = k8s_pending.shared(seen_by)
    backend._queue_positions = k8s_queues.shared(seen_by)
    # Objects are created with an owner token of the deployment secret, and only
    # objects that carry it are adopted or deleted (core/backends/k8s/ownership.py).
    backend.owner_secret = deployment_secret()
    return backend


def cluster_client_factory(config: KineticConfig, kind: str) -> Callable[[], Any]:
    """The Kubernetes client factory of the cluster ``config`` names (for ``kind``).

    The endpoint is looked up once through providers-google and kept in
    ``config.endpoint``.
    """
    from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
    from airflow_provider_kinetic.gcp.gke_auth import gke_api_client_factory

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
    return factory


def local_max_jobs() -> int:
    """``[kinetic] local_max_jobs``; unset: ``KINETIC_LOCAL_MAX_JOBS``, else the CPU count."""
    try:
        return resolve_max_jobs(conf.get(CONF_SECTION, "local_max_jobs", fallback=None))
    except ValueError as exc:
        raise KineticConfigError(str(exc)) from None


def local_inherit_env() -> bool:
    """``[kinetic] local_inherit_env``: local jobs see the worker's whole environment."""
    try:
        return conf.getboolean(CONF_SECTION, "local_inherit_env", fallback=False)
    except ValueError as exc:
        raise KineticConfigError(f"[{CONF_SECTION}] local_inherit_env: {exc}") from None


def k8s_retry_policy() -> Any:
    """The Kubernetes API retry policy from the ``[kinetic]`` options (see the module doc)."""
    from airflow_provider_kinetic.core.backends.k8s.retry import RetryPolicy

    try:
        return RetryPolicy(
            attempts=conf.getint(CONF_SECTION, "k8s_api_attempts", fallback=5),
            wait_initial_s=conf.getfloat(CONF_SECTION, "k8s_api_retry_wait_min", fallback=0.5),
            wait_max_s=conf.getfloat(CONF_SECTION, "k8s_api_retry_wait_max", fallback=15.0),
            retry_after_max_s=conf.getfloat(CONF_SECTION, "k8s_api_retry_after_max", fallback=30.0),
        )
    except ValueError as exc:
        raise KineticConfigError(f"[{CONF_SECTION}] Kubernetes API retry options: {exc}") from None
