"""A ``kinetic`` connection's extras -> :class:`KineticConfig`, and the config's JSON form.

Everything that reads what a connection stores lives here, apart from the hook, so
the field list, the parsing of UI strings and the error messages have one home:
extras that are not a JSON object, unknown extras (with the closest known name) and
values of the wrong type are errors raised before anything is uploaded.  A bad bucket
name or local root is checked by
:class:`~airflow_provider_kinetic.core.config.KineticConfig` itself.

Triggers carry the config as JSON (:func:`config_to_json`, :func:`config_from_json`):
trigger kwargs hold no objects and no file handles.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException, conf

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.catalog.capacity import InvalidCapacityError, parse_chain
from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
from airflow_provider_kinetic.core.jobs.polling import STORE_OUTAGE_WINDOW_S

#: The Airflow configuration section of this provider.
CONF_SECTION = "kinetic"


def store_outage_window_s() -> float:
    """``[kinetic] store_outage_window_s``: how long a poll rides out a store it cannot
    read before giving up (``core.jobs.polling.StoreOutage``)."""
    return conf.getfloat(CONF_SECTION, "store_outage_window_s", fallback=STORE_OUTAGE_WINDOW_S)


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
    "capacity",
    "data_layout",
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
    if isinstance(values.get("capacity"), str) and "," in values["capacity"]:
        values["capacity"] = [step.strip() for step in values["capacity"].split(",")]
    if "capacity" in values:
        try:
            parse_chain(values["capacity"])
        except InvalidCapacityError as exc:
            raise KineticConfigError(f"extra 'capacity' of {where}: {exc}") from None
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


def config_to_json(config: KineticConfig) -> str:
    """JSON form of a config for trigger kwargs (no objects, no file handles)."""
    return json.dumps(config.to_dict(), sort_keys=True)


def config_from_json(text: str) -> KineticConfig:
    """The config a trigger carries, as it was checked at deferral: not checked (nor
    its local root created) again, so a poll never recreates a store that went away."""
    return KineticConfig.rebuilt(json.loads(text))
