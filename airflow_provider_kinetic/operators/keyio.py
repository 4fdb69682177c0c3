"""Keys as a Kinetic task's inputs and output, on the Airflow side.

- ``kinetic://KEY`` Data are pinned per task instance before the job is planned
  (``core/keys/pins.py``): the versions go into the job's handle (``data_keys``),
  the XCom ``kinetic_keys`` and the task log, and every try of the run reads them.
- ``output_key``: once the job succeeded and its value was delivered, its output
  dir becomes the key's new version (``core/keys/publish.py``), shown in the task
  log and the XCom ``kinetic_output_key``, with an asset event for
  ``kinetic://KEY`` where a key moved (``operators/assets.emit_key``).

Kept apart from the operators' modules so they change by a line or two each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC
from typing import Any

from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import PlannedJob
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError, check_key
from airflow_provider_kinetic.core.keys.pins import pin_values
from airflow_provider_kinetic.core.keys.publish import (
    NEWEST_LOGICAL_DATE,
    check_policy,
    publish_output,
)
from airflow_provider_kinetic.core.keys.records import LOGICAL_DATE
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.keys import keep_versions
from airflow_provider_kinetic.operators import assets
from airflow_provider_kinetic.operators.common import task_identity

#: The handle's extra: the ``kinetic://`` versions the job reads.
DATA_KEYS = "data_keys"
XCOM_KEYS = "kinetic_keys"
XCOM_OUTPUT_KEY = "kinetic_output_key"
_WHO = ("dag_id", "task_id", "run_id", "map_index")


def check_output_key(value: Any, task_id: str, rendered: bool) -> str | None:
    """``output_key`` of the allowed key form (None: none).  Before rendering a
    templated value is left for later; after rendering it must be a key."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise KeyNameError(f"task {task_id!r}: output_key {value!r} is not a string")
    if not rendered and ("{{" in value or "{%" in value):
        return value
    try:
        return check_key(value)
    except KeyNameError as exc:
        raise KeyNameError(f"task {task_id!r}: output_key: {exc}") from None


def pin_request(
    operator: Any,
    context: Mapping[str, Any],
    store: ObjectStore,
    request: JobRequest,
    inputs: Any = None,
) -> tuple[JobRequest, Any, list[dict[str, str]]]:
    """The request (and a batch's ``inputs``) with its ``kinetic://`` Data pinned;
    the pins' rows (logged)."""
    values = [request.args, request.kwargs, request.volumes, inputs]
    identity, instance = task_identity(context), run_instance(context)
    (args, kwargs, volumes, inputs), pins = pin_values(store, identity, values, instance)
    if not pins:
        return request, inputs, []
    for pin in pins:
        how = {
            "pinned": "as the Data names it",
            "recorded": "recorded by an earlier try of this run",
            "resolved": "the current version; recorded: this run's retries read the same",
        }[pin.source]
        operator.log.info(
            "kinetic: Data kinetic://%s -> version %s (%s)", pin.key, pin.version, how
        )
    pinned = replace(request, args=args, kwargs=kwargs, volumes=volumes)
    return pinned, inputs, [p.row() for p in pins]


def run_instance(context: Mapping[str, Any]) -> dict[str, Any] | None:
    """What tells this DAG run instance from an earlier one under the same run id
    (``core.keys.pins.same_run_instance``); None without a run (a dry run)."""
    dag_run = context.get("dag_run")
    if dag_run is None:
        return None
    start = getattr(dag_run, "start_date", None)
    ti = context.get("ti")
    return {
        "clear_number": int(getattr(dag_run, "clear_number", 0) or 0),
        "run_start": start.isoformat() if start is not None else None,
        "try_number": int(getattr(ti, "try_number", 0) or 0),
        "ti_id": str(getattr(ti, "id", "") or ""),
    }


def pin_batch(
    operator: Any, context: Any, store: ObjectStore, request: JobRequest, inputs: Any
) -> tuple[JobRequest, Any]:
    """A batch's request and inputs pinned (XCom ``kinetic_keys``); a dry run
    (no context) resolves at packing instead."""
    if context is None:
        return request, inputs
    request, inputs, rows = pin_request(operator, context, store, request, inputs)
    push_pins(context, rows)
    return request, inputs


def with_pins(planned: PlannedJob, rows: list[dict[str, str]]) -> PlannedJob:
    """The planned job whose handle names the versions it reads."""
    if rows:
        extra = {**planned.handle.extra, DATA_KEYS: rows}
        planned.handle = replace(planned.handle, extra=extra)
    return planned


def push_pins(context: Mapping[str, Any], handle: JobHandle | list[dict[str, str]]) -> None:
    """XCom ``kinetic_keys``: the versions the task's job (or batch) reads (from a
    job's handle, so an adopted or collected job of an earlier try shows its own)."""
    rows = handle if isinstance(handle, list) else handle.extra.get(DATA_KEYS)
    if rows:
        context["ti"].xcom_push(key=XCOM_KEYS, value=list(rows))


def put_output_key(
    operator: Any, context: Mapping[str, Any], store: ObjectStore, handle: JobHandle
) -> dict[str, Any] | None:
    """After the job succeeded: its output dir under ``operator.output_key``."""
    key = check_output_key(getattr(operator, "output_key", None), operator.task_id, True)
    if key is None or not handle.output_dir:
        return None
    policy = check_policy(getattr(operator, "output_key_policy", NEWEST_LOGICAL_DATE))
    identity = task_identity(context)
    who = {k: identity.get(k) for k in _WHO}
    who["job_id"] = handle.job_id
    when = logical_date(context)
    if when is not None:
        who[LOGICAL_DATE] = when
    keys = KeyStore(store, keep=keep_versions())
    row = publish_output(keys, key, handle.output_dir, who, policy)
    operator.log.info(
        "kinetic: output_key %s -> version %s (%d files, %d bytes, by %s)%s",
        key,
        row["version"],
        row["files"],
        row["size"],
        "/".join(str(who[k]) for k in _WHO),
        "" if row["new"] else ": this content was already the key's version, no new version",
    )
    if row.get("aside"):
        operator.log.warning(
            "kinetic: output_key %s: version %s kept aside, the key not moved: %s "
            "(output_key_policy=%r: keys move forward; it is stored and listed, "
            "kinetic://%s@%s reads it; output_key_policy='last_finisher' moves the key "
            "to whichever run finishes last)",
            key,
            row["version"][:12],
            row["aside"],
            policy,
            key,
            row["version"][:12],
        )
    context["ti"].xcom_push(key=XCOM_OUTPUT_KEY, value=row)
    if row["new"] and not row.get("aside"):
        assets.emit_key(operator, context, key, row, store)
    else:  # the key did not move: no event of its asset
        assets.drop_key_outlet(operator, key)
    return row


def logical_date(context: Mapping[str, Any]) -> str | None:
    """The run's logical date in UTC ISO 8601 (None: a run without one, Airflow 3's
    manual runs may have none)."""
    when = context.get("logical_date")
    if when is None:
        dag_run = context.get("dag_run")
        when = getattr(dag_run, "logical_date", None)
    if when is None or not hasattr(when, "astimezone"):
        return None
    if getattr(when, "tzinfo", None) is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat()
