"""KineticHook: a ``kinetic`` connection -> object store + backend.

With no ``kinetic_default`` connection the hook falls back to the embedded local
backend rooted at ``$AIRFLOW_HOME/kinetic``, so a DAG runs on a laptop with no
cloud account; the task log says so with a WARNING.  A hook that only reads
(``read_only=True``, or made inside :func:`reading_only`, as the read-only CLI
commands' hooks are) runs nothing, so it says that at DEBUG only.  Production
deployments set
``[kinetic] allow_local_fallback = False`` (``AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK``)
to make the missing connection an error instead.

Every other configuration problem is an error raised before anything is uploaded:
a named connection that does not exist (here), extras that are not a JSON object or
unknown extras (:mod:`~airflow_provider_kinetic.deployment.connection`), a bad bucket name
or local root (checked by :class:`~airflow_provider_kinetic.core.config.KineticConfig`).

The hook's helpers live beside it: reading the extras and the config's JSON form for
triggers in :mod:`~airflow_provider_kinetic.deployment.connection`, building backends and
cluster clients (and the ``[kinetic] k8s_api_*`` retry options) in
:mod:`~airflow_provider_kinetic.deployment.backends`, the connection test's checks in
:mod:`~airflow_provider_kinetic.deployment.probe`.  ``config_to_json`` is re-exported here
for the operators and sensors.

Airflow options (section ``[kinetic]``):

* ``allow_local_fallback`` (bool, default True): see above;
* ``k8s_api_attempts``, ``k8s_api_retry_wait_min`` / ``k8s_api_retry_wait_max``,
  ``k8s_api_retry_after_max``: see :mod:`~airflow_provider_kinetic.deployment.backends`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook, conf

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.backends import backend_for
from airflow_provider_kinetic.deployment.connection import (
    CONF_SECTION,
    KineticConnectionNotFound,
    config_from_extras,
    config_to_json,
    default_local_root,
    parse_extra,
)
from airflow_provider_kinetic.deployment.probe import probe_cluster, probe_store

__all__ = [
    "CONF_SECTION",
    "KineticConnectionNotFound",
    "KineticHook",
    "backend_for",
    "config_from_extras",
    "config_to_json",
    "reading_only",
]

#: Local roots the missing-connection warning was given for, in this process: a task
#: builds hooks in many places (plan, poll, collect, cleanup), and a task log or a CLI
#: command's stderr needs the warning once, not at every one.
_WARNED_FALLBACK: set[str] = set()

#: True inside ``reading_only()``: hooks made there default to ``read_only=True``.
_READING_ONLY: ContextVar[bool] = ContextVar("kinetic_reading_only", default=False)


@contextlib.contextmanager
def reading_only() -> Iterator[None]:
    """Hooks made inside only read the store (``airflow kinetic jobs list``, ...): the
    local fallback's "jobs run ON THIS MACHINE" warning is not theirs to give."""
    token = _READING_ONLY.set(True)
    try:
        yield
    finally:
        _READING_ONLY.reset(token)


class KineticHook(BaseHook):
    """Resolve where kinetic jobs run and how to reach their store.

    Args:
        kinetic_conn_id: a connection of type ``kinetic``.  Extras: ``backend``
            (local, gke, pathways, jobset, auto), ``bucket`` or ``root``, ``project``, ``zone``,
            ``cluster``, ``namespace``, ``image``, ``service_account``.
        read_only: the hook only reads jobs and the store, so the local fallback does
            not warn that jobs run on this machine (None: True inside ``reading_only()``).

    ``resumed`` (set by a task resumed after a deferral): the try's first segment, in
    another process, already warned of the local fallback, so this one does not: one
    warning per task try.
    """

    #: A resumed execution segment's hook (see the class): the fallback is not repeated.
    resumed: bool = False

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

    def __init__(
        self,
        kinetic_conn_id: str = default_conn_name,
        *,
        read_only: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.kinetic_conn_id = kinetic_conn_id
        self.read_only = _READING_ONLY.get() if read_only is None else read_only
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
        if self.read_only:  # nothing runs: the store read is the only news
            self.log.debug(
                "No %r connection: reading the local store %s", self.default_conn_name, root
            )
            return KineticConfig(backend=LocalBackend.name, root=root)
        if root in _WARNED_FALLBACK or self.resumed:  # once per process, and per try
            return KineticConfig(backend=LocalBackend.name, root=root)
        _WARNED_FALLBACK.add(root)
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
        from airflow_provider_kinetic.gcp.gcs_auth import store_for

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
