"""Airflow Assets for Kinetic tasks: the output dir as an asset event, Data as inlets.

A Kinetic task's output dir differs per run (``outputs/{dag}/{run}/{task}/{map}``), so
it cannot be declared as an ``Asset`` when the DAG file is parsed.  The operator
declares an ``AssetAlias`` instead (``alias_name``: ``kinetic:{dag_id}/{task_id}``)
and, when its job succeeds, adds an event for the run's output dir through it; a
downstream DAG scheduled on that alias gets one event per successful run (the dir is
``event.extra["output_dir"]``, spelled so that ``Data(...)`` of it is a directory).  A
key's new version (``output_key``) is an event for ``kinetic://KEY`` through the same
alias, with the same extra plus the version's fields (``key``, ``version``, ``size``,
``files``, ``time``): every event the alias carries has ``output_dir`` and ``job_id``.

(Not one stable asset per task yet: an alias event of an asset Airflow does not hold
yet makes Airflow create it, and two runs doing so at once fail one task on the API
server's unique constraint, apache/airflow 3.3.2 ``models/taskinstance.py``,
"Dynamically creating AssetModel"; a per-run dir never collides.)

Making an ``Asset`` has Airflow look up a normalizer for its URI's scheme, and that
first lookup imports every installed provider's asset handlers (the google provider's
GCS hook, protobuf: 0.5 s quiet, 8-46 s on a loaded machine, once per task process).
A key's ``kinetic://`` URI, which this provider makes already normalized, is made
without the lookup (:func:`known_asset`); an output dir's was looked up before its job
was submitted (``asset_uri``), so its event costs nothing more.

When the user declares ``outlets`` the operator adds no alias of its own: Airflow
emits the events of the declared assets itself, and the operator attaches its
extra to each of them; an alias among them gets the output dir's event.

Airflow refuses some URIs (the ``airflow`` scheme, a gs:// URI without a bucket,
more than 1,500 characters): an ``output_dir`` it would refuse fails when the DAG
file is parsed (templates replaced by a placeholder) or, for the rendered or
default dir, before the job is submitted: never as a failed asset event after a
job that ran.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from airflow.providers.common.compat.sdk import Asset, AssetAlias

from airflow_provider_kinetic.core.jobs.payload import data_found
from airflow_provider_kinetic.core.jobs.resultref import is_result_ref

#: The alias every Kinetic task adds to its outlets (unless it declares its own).
ALIAS_PREFIX = "kinetic:"
#: The scheme of :func:`known_asset`'s stand-in URI (``x-``: Airflow normalizes none).
STAND_IN_SCHEME = "x-kinetic"
#: The most JSON bytes of the function's value (and of a batch's child dirs) that an
#: event's extra carries; larger values are left out (the XCom still has them).
MAX_EXTRA_VALUE_BYTES = 4096

_TEMPLATE = re.compile(r"{{.*?}}|{%.*?%}", re.DOTALL)


def alias_name(dag_id: str, task_id: str) -> str:
    """``kinetic:{dag_id}/{task_id}``: DAG and task ids never hold ``/`` (Airflow's
    key rule), so every pair has its own alias."""
    return f"{ALIAS_PREFIX}{dag_id}/{task_id}"


def task_alias(dag_id: str, task_id: str) -> AssetAlias:
    """The ``AssetAlias`` a downstream DAG schedules on (``schedule=[task_alias(...)]``)."""
    return AssetAlias(alias_name(dag_id, task_id))


def known_asset(uri: str) -> Any:
    """``Asset(uri=uri)`` for a URI this provider made in its normalized form (a key's
    ``kinetic://KEY``), without Airflow's scheme normalizer lookup (see the module):
    equal to what ``Asset(uri=uri)`` makes (tests/unit/operators/test_asset_uris.py)."""
    parts = urllib.parse.urlsplit(uri)  # Airflow's scheme-independent normal form
    normal = urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") or "/"))
    asset = Asset(name=uri, uri=f"{STAND_IN_SCHEME}://stand-in")
    object.__setattr__(asset, "uri", normal)  # the converter would look the scheme up
    return asset


def asset_uri(uri: str, what: str = "output_dir") -> str:
    """``uri`` as Airflow stores it (trailing ``/`` dropped, the scheme's own rules:
    the google provider's for gs://); a URI Airflow refuses raises ``ValueError``
    naming ``what`` and Airflow's reason."""
    try:
        return Asset(uri=uri).uri
    except (ValueError, TypeError) as exc:
        why = f"{what} {uri!r} is not a URI Airflow accepts for an asset: {exc}"
        raise ValueError(why) from exc


def check_output_dir(output_dir: Any, task_id: str) -> None:
    """Parse time: an ``output_dir`` Airflow would refuse as an asset URI fails now.
    Jinja parts are replaced by a placeholder (what they render to is checked again
    before the job is submitted)."""
    if isinstance(output_dir, str) and output_dir:
        asset_uri(_TEMPLATE.sub("x", output_dir), f"task {task_id!r}: output_dir")


def setup(operator: Any, *, user_outlets: bool, argument_fields: Iterable[str]) -> None:
    """``__init__`` of a Kinetic operator: check ``output_dir``, add the task alias to
    the outlets (none when the user declared outlets), and make every ``Data`` of an
    asset (or of a URI an asset of the DAG declares) an inlet."""
    if not operator.output_asset:
        return
    check_output_dir(operator.output_dir, operator.task_id)
    if not user_outlets and operator.has_dag():
        alias = task_alias(operator.dag_id, operator.task_id)
        if alias not in operator.outlets:
            operator.add_outlets([alias])
    declared = _declared_assets(operator.dag) if operator.has_dag() else {}
    for name in argument_fields:
        for asset in _data_assets(getattr(operator, name, None), declared):
            if asset not in operator.inlets:
                operator.add_inlets([asset])


def _declared_assets(dag: Any) -> dict[str, Any]:
    """URI -> asset of the assets this DAG names so far: its schedule and the inlets
    and outlets of its tasks."""
    found: dict[str, Any] = {}
    pending = [getattr(getattr(dag, "timetable", None), "asset_condition", None)]
    while pending:  # AssetAll / AssetAny hold ``objects`` (3.3 has no iter_assets here)
        obj = pending.pop()
        if isinstance(obj, Asset):
            found[obj.uri] = obj
        pending.extend(getattr(obj, "objects", ()) or ())
    for task in getattr(dag, "tasks", ()):
        for obj in (*getattr(task, "inlets", ()), *getattr(task, "outlets", ())):
            if isinstance(obj, Asset):
                found[obj.uri] = obj
    return found


def _data_assets(value: Any, declared: Mapping[str, Any]) -> Iterator[Any]:
    for data, _ in data_found(value, ""):
        if isinstance(data.asset, Asset):
            yield data.asset
        elif "://" in data.path and "{" not in data.path:
            try:
                uri = Asset(uri=data.path).uri
            except (ValueError, TypeError):
                continue  # not an asset URI: the Data's own checks speak at submit
            if uri in declared:
                yield declared[uri]


def small_json(value: Any, limit: int = MAX_EXTRA_VALUE_BYTES) -> Any | None:
    """``value`` when it is strict JSON of at most ``limit`` bytes (a metrics dict),
    else None; a result reference (a value too large for XCom) is never the value."""
    if value is None or is_result_ref(value):
        return None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return json.loads(text) if len(text.encode()) <= limit else None


def job_extra(handle: Any, value: Any, output_dir: str) -> dict[str, Any]:
    """The extra of a single job's event: what a downstream DAG wants without XCom."""
    extra: dict[str, Any] = {
        "output_dir": output_dir,
        "job_id": handle.job_id,
        "backend": handle.backend,
        "accelerator": handle.accelerator,
    }
    if handle.capacity:
        extra["capacity"] = handle.capacity
    if (small := small_json(value)) is not None:
        extra["value"] = small
    return extra


def batch_extra(
    state: Any, value: Any, output_dir: str, child_dirs: list[str], capacity: Mapping[str, int]
) -> dict[str, Any]:
    """The extra of a batch's one event (its parent output dir): the group, the child
    count, the children's dirs and values when they fit."""
    extra: dict[str, Any] = {
        "output_dir": output_dir,
        "group_id": state.group_id,
        "children": state.total,
        "backend": state.backend,
        "accelerator": state.template.options.accelerator,
    }
    if capacity:
        extra["capacity"] = dict(capacity)
    if (dirs := small_json(child_dirs)) is not None:
        extra["output_dirs"] = dirs
    if (small := small_json(value)) is not None:
        extra["value"] = small
    return extra


def emit(operator: Any, context: Mapping[str, Any], output_dir: str, extra: dict) -> None:
    """After the job succeeded: the output dir's event through every alias in the
    outlets, and ``extra`` on every declared asset's own event (Airflow emits it)."""
    if not operator.output_asset:
        return
    events = context.get("outlet_events")
    if events is None:
        return
    usage = small_json(getattr(operator, "kinetic_usage", None))
    if usage is not None:  # the usage record (core.jobs.usage), as XCom kinetic_usage
        extra = {**extra, "usage": usage}
    operator.kinetic_event_extra = extra  # a key's event carries it too (emit_key)
    asset = Asset(uri=asset_uri(output_dir))
    for outlet in operator.outlets:
        if isinstance(outlet, AssetAlias):
            events[outlet].add(asset, extra=extra)
            operator.log.info("kinetic: asset event %s through alias %s", asset.uri, outlet.name)
        elif isinstance(outlet, Asset):
            events[outlet].extra.update(extra)


def key_asset_uri(key: str) -> str:
    """The asset a key's versions are events of: ``kinetic://KEY``."""
    return f"kinetic://{key}"


def emit_key(operator: Any, context: Mapping[str, Any], key: str, row: Mapping) -> None:
    """A key's new version (``output_key``): an event for ``kinetic://KEY`` through
    every alias in the outlets (a DAG scheduled on ``Asset("kinetic://KEY")`` runs),
    and the version's row on a declared ``kinetic://KEY`` outlet's own event."""
    events = context.get("outlet_events")
    if not operator.output_asset or events is None:
        return
    extra = {k: row[k] for k in ("key", "version", "size", "files", "time") if k in row}
    extra = {**getattr(operator, "kinetic_event_extra", {}), **extra}  # one extra shape
    asset = known_asset(key_asset_uri(key))
    for outlet in operator.outlets:
        if isinstance(outlet, AssetAlias):
            events[outlet].add(asset, extra=extra)
            operator.log.info("kinetic: asset event %s through alias %s", asset.uri, outlet.name)
        elif isinstance(outlet, Asset) and outlet.uri == asset.uri:
            events[outlet].extra.update(extra)
