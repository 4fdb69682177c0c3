"""KineticHook: a ``kinetic`` connection -> object store + backend.

With no ``kinetic_default`` connection the hook falls back to the embedded local
backend rooted at ``$AIRFLOW_HOME/kinetic``, so a DAG runs on a laptop with no
cloud account; the task log says so with a WARNING.  Production deployments set
``[kinetic] allow_local_fallback = False`` (``AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK``)
to make the missing connection an error instead.

Every other configuration problem is an error raised before anything is uploaded:
extras that are not a JSON object, unknown extras (with the closest known name),
a named connection that does not exist, a bad bucket name or local root (checked by
:class:`~airflow_provider_kinetic.core.config.KineticConfig`).

Airflow options (section ``[kinetic]``):

* ``allow_local_fallback`` (bool, default True): see above;
* ``k8s_api_attempts`` (int, default 5), ``k8s_api_retry_wait_min`` /
  ``k8s_api_retry_wait_max`` (seconds, default 0.5 / 15), ``k8s_api_retry_after_max``
  (seconds, default 30): how Kubernetes API calls that answer 429/5xx or lose their
  connection are retried (:mod:`~airflow_provider_kinetic.core.backends.k8s_retry`).
"""

from __future__ import annotations

import difflib
import json
import os
import secrets
from collections.abc import Callable
from typing import Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook, conf

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.local import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
from airflow_provider_kinetic.core.storage import ObjectStore

#: The Airflow configuration section of this provider.
CONF_SECTION = "kinetic"

_EXTRA_FIELDS = (
    "gcp_conn_id",
    "impersonation_chain",
    "endpoint",
    "use_internal_ip",
    "use_dns_endpoint",
    "image_pull_grace_s",
    "schedule_timeout_s",
    "create_grace_s",
    "ttl_seconds_after_finished",
    "backend",
    "bucket",
    "root",
    "project",
    "zone",
    "cluster",
    "namespace",
    "image",
    "container_image",
    "base_image_repo",
    "artifact_registry_location",
    "artifact_registry_repository",
    "service_account",
    "runner_command",
)


_NUMBER_FIELDS = ("image_pull_grace_s", "schedule_timeout_s", "create_grace_s")
_BOOL_FIELDS = ("use_internal_ip", "use_dns_endpoint")
#: How the connection form (Airflow < 3.2) prefixes extras.
_FORM_PREFIX = "extra__kinetic__"


class KineticConnectionNotFound(KineticConfigError, AirflowNotFoundException):
    """A ``kinetic_conn_id`` that names no connection (only ``kinetic_default`` may be absent)."""


def parse_extra(text: str | None, conn_id: str) -> dict[str, Any]:
    """The connection's extras as a dict; invalid JSON, or JSON that is not an object,
    is an error (Airflow's ``extra_dejson`` would log it and return ``{}``, which used
    to send jobs to the local backend)."""
    if text is None or not str(text).strip():
        return {}
    try:
        extras = json.loads(text)
    except ValueError as exc:
        raise KineticConfigError(
            f"the extras of connection {conn_id!r} are not valid JSON ({exc}): {_clip(text)!r}; "
            'write them as a JSON object, e.g. {"backend": "gke", "bucket": "my-jobs"}'
        ) from None
    if not isinstance(extras, dict):
        raise KineticConfigError(
            f"the extras of connection {conn_id!r} must be a JSON object, "
            f"not {type(extras).__name__}: {_clip(text)!r}"
        )
    return extras


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def unknown_extras(extras: dict[str, Any]) -> list[str]:
    """Keys of ``extras`` that are not kinetic connection extras, each with a hint."""
    problems = []
    for key in extras:
        name = key.removeprefix(_FORM_PREFIX)
        if name in _EXTRA_FIELDS:
            continue
        close = difflib.get_close_matches(name, _EXTRA_FIELDS, n=1, cutoff=0.6)
        problems.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return problems


def default_local_root() -> str:
    """``$AIRFLOW_HOME/kinetic`` — where the embedded local backend keeps its store."""
    home = os.environ.get("AIRFLOW_HOME") or conf.get("core", "airflow_home", fallback=None)
    return os.path.join(home or os.path.expanduser("~/airflow"), "kinetic")


def config_from_extras(extras: dict[str, Any], conn_id: str | None = None) -> KineticConfig:
    """Build a KineticConfig from connection extras (plain or ``extra__kinetic__`` keys).

    Unknown keys are an error naming the closest known extra (a misspelt ``bucket``
    must not silently mean "no bucket").
    """
    where = f"connection {conn_id!r}" if conn_id else "the connection"
    if not isinstance(extras, dict):
        raise KineticConfigError(
            f"the extras of {where} must be a JSON object, not {type(extras).__name__}"
        )
    unknown = unknown_extras(extras)
    if unknown:
        raise KineticConfigError(
            f"{where} has unknown extra{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"known extras: {', '.join(_EXTRA_FIELDS)}"
        )
    values: dict[str, Any] = {}
    for name in _EXTRA_FIELDS:
        value = extras.get(name, extras.get(f"{_FORM_PREFIX}{name}"))
        if value not in (None, ""):
            values[name] = value
    if isinstance(values.get("runner_command"), str):
        values["runner_command"] = values["runner_command"].split()
    if isinstance(values.get("endpoint"), str):  # the UI stores extras as strings
        try:
            values["endpoint"] = json.loads(values["endpoint"])
        except ValueError as exc:
            raise KineticConfigError(
                f"extra 'endpoint' of {where} is not valid JSON ({exc}): "
                f'{_clip(values["endpoint"])!r}; expected {{"host": "https://...", "ca_data": ...}}'
            ) from None
    for name in _NUMBER_FIELDS:
        if name in values:
            values[name] = _number(name, values[name])
    if "ttl_seconds_after_finished" in values:
        ttl = _number("ttl_seconds_after_finished", values["ttl_seconds_after_finished"])
        if ttl < 0 or ttl != int(ttl):
            raise KineticConfigError(
                f"extra 'ttl_seconds_after_finished' must be a whole number of seconds >= 0, "
                f"got {values['ttl_seconds_after_finished']!r}"
            )
        values["ttl_seconds_after_finished"] = int(ttl)
    for name in _BOOL_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = values[name].strip().lower() in ("1", "true", "yes")
    values.setdefault(
        "backend", "gke" if values.get("bucket") or values.get("cluster") else "local"
    )
    if values["backend"] == LocalBackend.name:
        values.setdefault("root", default_local_root())
    return KineticConfig(**values)


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

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden fields and placeholders (Airflow before 3.2 reads the form from here)."""
        from airflow_provider_kinetic.provider_info import field_behaviour

        return field_behaviour()

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The form's extra fields for Airflow before 3.2, which ignores the declarative
        ``conn-fields`` of the provider info (3.2+ reads those and never calls this).

        Built from the same description (``provider_info.FORM``), so both forms have the
        same fields, labels, descriptions, types and ``backend`` choices.  The imports
        stay inside: the API server swaps wtforms/flask-appbuilder for stand-ins that
        turn each field into a JSON schema, and without a UI they are not installed.
        """
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
        from flask_babel import lazy_gettext
        from wtforms import BooleanField, IntegerField, StringField
        from wtforms.validators import Optional, any_of

        from airflow_provider_kinetic.provider_info import conn_fields

        classes = {"string": StringField, "number": IntegerField, "boolean": BooleanField}
        widgets: dict[str, Any] = {}
        for name, field in conn_fields().items():
            kind = field["schema"]["type"][0]
            options: dict[str, Any] = {"description": field["description"]}
            if kind != "boolean":
                options["widget"] = BS3TextFieldWidget()
            if "enum" in field["schema"]:
                options["validators"] = [Optional(), any_of(field["schema"]["enum"])]
            widgets[name] = classes[kind](lazy_gettext(field["label"]), **options)
        return widgets

    def __init__(self, kinetic_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kinetic_conn_id = kinetic_conn_id
        self._config: KineticConfig | None = None

    def get_config(self) -> KineticConfig:
        if self._config is None:
            self._config = self._load_config()
        return self._config

    def _load_config(self) -> KineticConfig:
        conn_id = self.kinetic_conn_id
        try:
            conn = self.get_connection(conn_id)
        except AirflowNotFoundException as exc:
            if conn_id != self.default_conn_name:
                env = "AIRFLOW_CONN_" + conn_id.upper()
                raise KineticConnectionNotFound(
                    f"the kinetic connection {conn_id!r} does not exist: create a connection "
                    f"of type 'kinetic' with that id (e.g. the environment variable {env}), "
                    "or fix kinetic_conn_id"
                ) from exc
            return self._local_fallback()
        return config_from_extras(parse_extra(conn.extra, conn_id), conn_id)

    def _local_fallback(self) -> KineticConfig:
        """The embedded local backend, when ``kinetic_default`` is missing and allowed to be."""
        option = f"[{CONF_SECTION}] allow_local_fallback"
        if not conf.getboolean(CONF_SECTION, "allow_local_fallback", fallback=True):
            raise KineticConnectionNotFound(
                f"there is no {self.default_conn_name!r} connection and {option} is False, so "
                "jobs will not fall back to running on this machine: create the "
                f"{self.default_conn_name!r} connection (type 'kinetic'), or pass "
                "kinetic_conn_id, or set allow_local_fallback = True "
                "(AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK)"
            )
        root = default_local_root()
        self.log.warning(
            "No %r connection: jobs run ON THIS MACHINE with the embedded local backend "
            "(store %s). Create the connection to run them on a cluster; set %s = False "
            "to make this an error.",
            self.default_conn_name,
            root,
            option,
        )
        return KineticConfig(backend=LocalBackend.name, root=root)

    def get_store(self) -> ObjectStore:
        """The store, with the credentials of the connection's ``gcp_conn_id``."""
        from airflow_provider_kinetic.hooks.gcs_auth import store_for

        return store_for(self.get_config())

    def get_backend(self, kind: str | None = None) -> Backend:
        """The backend for ``kind`` (a handle's ``backend``), else the connection's."""
        return backend_for(self.get_config(), kind)

    def get_conn(self) -> KineticConfig:
        return self.get_config()

    def test_connection(self) -> tuple[bool, str]:
        """Write, read back and delete a probe object in the store; for cluster backends,
        check that the API server answers, the namespace exists and (pathways) the
        LeaderWorkerSet API is installed.  Returns (ok, what was checked or what failed).
        """
        done: list[str] = []
        try:
            config = self.get_config()
            done.append(probe_store(config.store()))
            done.extend(probe_cluster(config))
        except Exception as exc:  # noqa: BLE001 - the UI shows the message
            failed = f"{type(exc).__name__}: {exc}"
            return False, "; ".join([*done, failed]) if done else failed
        return True, "; ".join(done)


def probe_store(store: ObjectStore) -> str:
    """Write, read and delete one object under a fresh prefix; raise on any mismatch."""
    token = secrets.token_hex(8)
    prefix = f"_kinetic-connection-test-{token}/"
    key = prefix + "probe"
    data = f"kinetic connection test {token}\n".encode()
    step = "writing a probe object"
    try:
        store.write_bytes(key, data, if_absent=True)
        try:
            step = "reading the probe object back"
            back = store.read_bytes(key)
        finally:
            step = "deleting the probe object"
            store.delete_prefix(prefix)
    except Exception as exc:
        raise KineticConfigError(
            f"store {store.uri()}: {step} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if back != data:
        raise KineticConfigError(f"store {store.uri()} returned other bytes than were written")
    if store.exists(key):
        raise KineticConfigError(f"store {store.uri()} did not delete {key!r}")
    return f"store {store.uri()} works (probe object written, read back and deleted)"


def probe_cluster(config: KineticConfig) -> list[str]:
    """Check the cluster of a cluster backend; ``[]`` when the target needs none."""
    kinds = (
        [cls.name for cls in registry.auto_candidates()]
        if config.backend == registry.AUTO
        else [config.backend]
    )
    classes = [registry.backend_class(kind) for kind in kinds]
    if not any(cls.needs_cluster for cls in classes):
        return []
    from airflow_provider_kinetic.core.backends import k8s_retry
    from airflow_provider_kinetic.core.backends.k8s_api import Call
    from airflow_provider_kinetic.core.backends.manifests import LWS_GROUP
    from airflow_provider_kinetic.core.backends.pathways import PathwaysBackend

    factory = cluster_client_factory(config, kinds[0])
    host = factory.endpoint.host if hasattr(factory, "endpoint") else "the cluster"
    client = factory()
    done = []
    try:

        def get(what: str, call: Call) -> Any:
            try:
                answer = k8s_retry.call_sync(client, call)
            except Exception as exc:  # noqa: BLE001 - transport errors of either client
                raise KineticConfigError(
                    f"{what}: the API server {host} did not answer: {exc}"
                ) from exc
            if answer.status == 404:
                return None
            if not answer.ok:
                detail = answer.body[:200].decode("utf-8", "replace")
                raise KineticConfigError(f"{what}: HTTP {answer.status} from {host}: {detail}")
            return json.loads(answer.body or b"null")

        version = get("reading the cluster version", Call("VersionApi", "get_code")) or {}
        done.append(f"cluster {config.cluster} ({host}) answers, {version.get('gitVersion', '?')}")
        ns = config.namespace
        if get(f"reading namespace {ns!r}", Call("CoreV1Api", "read_namespace", (ns,))) is None:
            raise KineticConfigError(
                f"namespace {ns!r} does not exist in cluster {config.cluster}: create it "
                "(kubectl create namespace) or set the 'namespace' extra"
            )
        done.append(f"namespace {ns!r} exists")
        if any(issubclass(cls, PathwaysBackend) for cls in classes):
            groups = (get("listing API groups", Call("ApisApi", "get_api_versions")) or {}).get(
                "groups"
            ) or []
            if any(g.get("name") == LWS_GROUP for g in groups):
                done.append(f"the LeaderWorkerSet API ({LWS_GROUP}) is installed")
            elif config.backend == registry.AUTO:
                done.append(
                    f"the LeaderWorkerSet API ({LWS_GROUP}) is not installed: "
                    "multi-host jobs cannot run"
                )
            else:
                raise KineticConfigError(
                    f"the LeaderWorkerSet API ({LWS_GROUP}) is not installed in cluster "
                    f"{config.cluster}: the pathways backend needs it (install LeaderWorkerSet, "
                    "https://lws.sigs.k8s.io/docs/installation/)"
                )
    finally:
        client.close()
    return done


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
    backend = cls.from_config(config, cluster_client_factory(config, kind))
    backend.retry_policy = k8s_retry_policy()
    return backend


def cluster_client_factory(config: KineticConfig, kind: str) -> Callable[[], Any]:
    """The Kubernetes client factory of the cluster ``config`` names (for ``kind``).

    The endpoint is looked up once through providers-google and kept in
    ``config.endpoint``.
    """
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
    return factory


def k8s_retry_policy() -> Any:
    """The Kubernetes API retry policy from the ``[kinetic]`` options (see the module doc)."""
    from airflow_provider_kinetic.core.backends.k8s_retry import RetryPolicy

    try:
        return RetryPolicy(
            attempts=conf.getint(CONF_SECTION, "k8s_api_attempts", fallback=5),
            wait_initial_s=conf.getfloat(CONF_SECTION, "k8s_api_retry_wait_min", fallback=0.5),
            wait_max_s=conf.getfloat(CONF_SECTION, "k8s_api_retry_wait_max", fallback=15.0),
            retry_after_max_s=conf.getfloat(CONF_SECTION, "k8s_api_retry_after_max", fallback=30.0),
        )
    except ValueError as exc:
        raise KineticConfigError(f"[{CONF_SECTION}] Kubernetes API retry options: {exc}") from None


def config_to_json(config: KineticConfig) -> str:
    """JSON form of a config for trigger kwargs (no objects, no file handles)."""
    return json.dumps(config.to_dict(), sort_keys=True)


def config_from_json(text: str) -> KineticConfig:
    return KineticConfig(**json.loads(text))
