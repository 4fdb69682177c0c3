"""Airflow Assets for Kinetic tasks: one stable asset per task's output, Data as inlets.

Every Kinetic task (``output_asset=True``, the default) has one asset for its output,
made from its ids: ``x-kinetic-task://{dag_id}/{task_id}`` (:func:`task_asset`), and,
with a fixed ``output_key``, the key's ``kinetic://KEY``.  Both are on the task's
outlets when the DAG file is parsed, so the DAG processor registers them before any
run: a run only adds an *event*, whose extra says what changed (``output_dir``,
``job_id``, ``backend``, ``accelerator``, the function's small JSON ``value``,
``usage``; with ``output_key`` also ``key``, ``version``, ``size``, ``files``,
``time``).  No asset is made per run (before issue 42 every run's output dir was
one: a deployment held an asset per run).

The alias ``kinetic:{dag_id}/{task_id}`` (:func:`task_alias`) stays on the outlets
for DAGs scheduled on it: each successful run adds one event through it, with the
same extra (``triggering_asset_events[alias]`` lists one event per run;
``e.extra["output_dir"]`` is always there).  That event is the task asset's own
(Airflow's event for the declared outlet is then left out: one event per run on the
asset) once the alias is linked to it.  Airflow links an alias to an asset at its
first event for it, and two first events at once fail one of the tasks on Airflow's
unique constraint, so one run links it and runs that meet it in flight fall back:
the task asset gets Airflow's own event and the alias an event for the run's output
dir, as before issue 42 (``operators/asset_links``: which run links, and when it is
safe).  After the first successful linked run no run falls back.  A key's version
is an event of its own asset (declared: Airflow emits it) with the same extra.  A
templated ``output_key`` names its asset only at run time: its event goes through
the alias under the same rule, and a run that meets another run's first event for
that key leaves it out (logged; the task asset's event carries the key's fields).

Making an ``Asset`` has Airflow look up a normalizer for its URI's scheme, and that
first lookup imports every installed provider's asset handlers (the google provider's
GCS hook, protobuf: 0.5 s quiet, 8-46 s on a loaded machine, once per process).  No
asset made here needs it: the task asset's ``x-`` scheme has no normalizer, and a
key's ``kinetic://`` URI, which this provider makes already normalized, is made
without the lookup (:func:`known_asset`).

When the user declares ``outlets`` the operator adds no alias of its own: Airflow
emits the events of the declared assets itself, and the operator attaches its
extra to each of them; an alias among them gets the task asset's event (the task
asset is added to the outlets then, so it exists before that event).
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
from airflow_provider_kinetic.operators import asset_links

#: The alias every Kinetic task adds to its outlets (unless it declares its own).
ALIAS_PREFIX = "kinetic:"
#: The scheme of :func:`known_asset`'s stand-in URI (``x-``: Airflow normalizes none).
STAND_IN_SCHEME = "x-kinetic"
#: The scheme of a task's stable output asset (``x-``: Airflow normalizes none).
TASK_SCHEME = "x-kinetic-task"
#: The most JSON bytes of the function's value (and of a batch's child dirs) that an
#: event's extra carries; larger values are left out (the XCom still has them).
MAX_EXTRA_VALUE_BYTES = 4096
#: How long a run that meets another run's first event through an alias waits for it
#: to land before it falls back (``operators/asset_links``).
LINK_WAIT_S = 60.0

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


def task_asset_uri(dag_id: str, task_id: str) -> str:
    """``x-kinetic-task://{dag_id}/{task_id}``, each id percent-encoded (ids never
    hold ``/``, but may hold non-ASCII letters, which a URI may not)."""
    dag, task = (urllib.parse.quote(i, safe="") for i in (dag_id, task_id))
    return f"{TASK_SCHEME}://{dag}/{task}"


def task_asset(dag_id: str, task_id: str) -> Any:
    """The stable asset of a Kinetic task's output, to schedule a DAG on
    (``schedule=[task_asset("train_dag", "train")]``): one event per successful run,
    its extra saying what the run made (see the module).  An ``x-`` scheme, so Airflow
    looks up no normalizer for it."""
    return Asset(uri=task_asset_uri(dag_id, task_id))


def static_key(operator: Any) -> str | None:
    """The operator's ``output_key`` when it is fixed at parse time (no template)."""
    key = getattr(operator, "output_key", None)
    if isinstance(key, str) and key and not _TEMPLATE.search(key):
        return key
    return None


def setup(operator: Any, *, user_outlets: bool, argument_fields: Iterable[str]) -> None:
    """``__init__`` of a Kinetic operator: add the task alias, the task asset and a
    fixed key's asset to the outlets (when the user declared outlets: only the task
    asset, and only for an alias among them), and make every ``Data`` of an asset
    (or of a URI an asset of the DAG declares) an inlet."""
    if not operator.output_asset:
        return
    if operator.has_dag():
        ours = [] if user_outlets else [task_alias(operator.dag_id, operator.task_id)]
        if _from_mapped(operator):  # nothing declared at parse time: the alias only
            operator.add_outlets([o for o in ours if o not in operator.outlets])
            ours = []
        elif ours or any(isinstance(o, AssetAlias) for o in operator.outlets):
            ours.append(task_asset(operator.dag_id, operator.task_id))  # the alias's event
        if not user_outlets and (key := static_key(operator)) is not None:
            operator.kinetic_key_outlet = known_asset(key_asset_uri(key))
            ours.append(operator.kinetic_key_outlet)  # its versions' events
        operator.add_outlets([o for o in ours if o not in operator.outlets])
    declared = _declared_assets(operator.dag) if operator.has_dag() else {}
    for name in argument_fields:
        for asset in _data_assets(getattr(operator, name, None), declared):
            if asset not in operator.inlets:
                operator.add_inlets([asset])


def _from_mapped(operator: Any) -> bool:
    """Whether this is a mapped task's instance (``partial().expand()``), made at run
    time: its ``__init__`` did not run when the DAG file was parsed, so nothing it
    adds to its outlets is registered before its first event."""
    return bool(getattr(operator, "_BaseOperator__from_mapped", False))


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


def emit(
    operator: Any, context: Mapping[str, Any], output_dir: str, extra: dict, store: Any
) -> None:
    """After the job succeeded: the task asset's event through every alias in the
    outlets that is linked to it, or may be now (``asset_links``), else the run's output
    dir's; ``extra`` on every declared asset's own event (Airflow emits it)."""
    if not operator.output_asset:
        return
    events = context.get("outlet_events")
    if events is None:
        return
    usage = small_json(getattr(operator, "kinetic_usage", None))
    if usage is not None:  # the usage record (core.jobs.usage), as XCom kinetic_usage
        extra = {**extra, "usage": usage}
    operator.kinetic_event_extra = extra  # a key's version adds its fields (emit_key)
    _restore_outlets(operator)
    ours = task_asset(operator.dag_id, operator.task_id)
    declared = ours in operator.outlets  # not for a mapped instance (see setup)
    linked = False
    for outlet in list(operator.outlets):
        if isinstance(outlet, AssetAlias):
            asset = ours
            if not (declared and _via_alias(operator, context, store, outlet, ours)):
                asset = _run_asset(operator, output_dir, outlet)  # no shared link
                if asset is None:
                    continue
            linked = linked or asset is ours
            events[outlet].add(asset, extra=extra)
            operator.log.info("kinetic: asset event %s through alias %s", asset.uri, outlet.name)
        elif isinstance(outlet, Asset):
            events[outlet].extra.update(extra)
    if linked:  # the alias's event is the task asset's: Airflow adds no second one
        operator.outlets[:] = [o for o in operator.outlets if o != ours]


def _run_asset(operator: Any, output_dir: str, alias: Any) -> Any | None:
    """The run's own output dir as an asset (a mapped instance's, or a fallback's);
    None, with a warning, for a dir Airflow refuses as an asset URI (any dir the
    backend accepts is a valid ``output_dir``: the job's result stands)."""
    try:
        return Asset(uri=output_dir)
    except (ValueError, TypeError) as exc:
        operator.log.warning(
            "kinetic: no asset event through alias %s this run: its output dir %s is no "
            "asset URI Airflow accepts (%s)",
            alias.name,
            output_dir,
            exc,
        )
        return None


def _restore_outlets(operator: Any) -> None:
    """The outlets as declared, before this run leaves any out (:func:`emit`,
    :func:`drop_key_outlet`): a run in the same process as an earlier one
    (``dag.test``) starts from the declared list again, not from what the earlier
    run left."""
    declared = getattr(operator, "kinetic_declared_outlets", None)
    if declared is None:
        operator.kinetic_declared_outlets = list(operator.outlets)
    else:
        operator.outlets[:] = declared


def _via_alias(
    operator: Any, context: Mapping[str, Any], store: Any, alias: Any, asset: Any
) -> bool:
    """Whether this run adds ``asset``'s event through ``alias`` (``asset_links``)."""
    ti = context["ti"]
    me = asset_links.Linker(ti.dag_id, ti.task_id, ti.run_id, ti.map_index)

    def state_of(linker: asset_links.Linker) -> str | None:
        found = ti.get_task_states(
            dag_id=linker.dag_id, task_ids=[linker.task_id], run_ids=[linker.run_id]
        )
        name = linker.task_id if linker.map_index < 0 else f"{linker.task_id}_{linker.map_index}"
        return found.get(linker.run_id, {}).get(name)

    decision = asset_links.decide(store, alias.name, asset.uri, me, state_of, LINK_WAIT_S)
    if not decision.via_alias:
        operator.log.info(
            "kinetic: %s not through alias %s this run: %s", asset.uri, alias.name, decision.reason
        )
    return decision.via_alias


def key_asset_uri(key: str) -> str:
    """The asset a key's versions are events of: ``kinetic://KEY``."""
    return f"kinetic://{key}"


def emit_key(operator: Any, context: Mapping[str, Any], key: str, row: Mapping, store: Any) -> None:
    """A key's new version (``output_key``): its fields join the extra of every event
    the task adds (one extra shape: the alias's event says which version it made),
    and the key's asset gets its event: Airflow's own for a declared (fixed) key,
    else one through every alias in the outlets that may carry it (``asset_links``; a
    templated key's asset is known only now)."""
    events = context.get("outlet_events")
    if not operator.output_asset or events is None:
        return
    fields = {k: row[k] for k in ("key", "version", "size", "files", "time") if k in row}
    extra = getattr(operator, "kinetic_event_extra", None)
    if extra is None:
        extra = operator.kinetic_event_extra = {}
    extra.update(fields)  # the alias's event holds this dict (OutletEventAccessor.add)
    asset = known_asset(key_asset_uri(key))
    declared = any(isinstance(o, Asset) and o.uri == asset.uri for o in operator.outlets)
    for outlet in operator.outlets:
        if isinstance(outlet, AssetAlias):
            _update_alias_events(events[outlet], extra)
            if not declared and _via_alias(operator, context, store, outlet, asset):
                events[outlet].add(asset, extra=dict(extra))
                operator.log.info(
                    "kinetic: asset event %s through alias %s", asset.uri, outlet.name
                )
        elif isinstance(outlet, Asset):
            events[outlet].extra.update(extra)


def drop_key_outlet(operator: Any, key: str) -> None:
    """A run whose version did not move the key: the key's asset that :func:`setup`
    declared leaves this run's outlets, so Airflow, which emits an event for every
    outlet at the task's end, emits none for it (the worker reads the outlets then;
    a task with outlets never ends in its trigger: ``operators.end_task``).  An
    outlet the user declared stays."""
    ours = getattr(operator, "kinetic_key_outlet", None)
    if ours is not None and ours.uri == known_asset(key_asset_uri(key)).uri:
        operator.outlets[:] = [o for o in operator.outlets if o is not ours]


def _update_alias_events(accessor: Any, extra: dict) -> None:
    """The alias's events so far carry ``extra`` (whether Airflow kept the dict
    :func:`emit` gave it or a copy)."""
    for event in getattr(accessor, "asset_alias_events", ()):
        if event.extra is not extra:
            event.extra.update(extra)
