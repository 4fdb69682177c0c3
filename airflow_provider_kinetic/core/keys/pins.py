"""Pins: a task's ``kinetic://KEY`` Data resolved once per DAG run, read the same on
every try.

Why a record: "the current version" moves when someone puts the key again, but a
retry (or a clear) of the same task in the same DAG run must read the bytes its
first try read, or the run is not reproducible.  So the first resolution of each
unpinned key is written to ``_airflow/keypins/{dag}/{run}/{task}/{map_index}.json``
(ids through ``spec/identity.task_key``, like the task records) and every later try
of that task instance uses it; a new DAG run has another record and resolves anew.
``kinetic://KEY@VERSION`` pins by itself and is not recorded.

A run deleted and made again under the same run id is a new run: it resolves anew.
Airflow hands a worker no id of the run *instance*, so the record keeps what tells
instances apart (:func:`same_run_instance`): the run's ``clear_number`` (Airflow adds
one at every clear, a new run starts at 0) and ``start_date`` (kept across a task's
retries; a clear that re-queues the run sets it again, and adds to the count), the
task's try number and the try's task instance id (new at every try, kept by a
deferral's resume).

The Data are replaced by pinned copies (``kinetic://KEY@FULLHASH``): the operator's
own objects are never changed, so a later run in the same process (``dag.test``)
still resolves anew.  The job's handle and history entry name the versions
(``data_hashes``), so ``data gc`` keeps them while the job is in the history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.data.refs import KEEP, map_leaves
from airflow_provider_kinetic.core.data.schemes.kinetic import PREFIX, key_ref
from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.keys.keystore import PINS_PREFIX, KeyStore
from airflow_provider_kinetic.core.keys.names import parse_ref
from airflow_provider_kinetic.core.spec.identity import task_key
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

#: What a pin's row says of the task instance that recorded it.
PIN_IDENTITY = ("dag_id", "run_id", "task_id", "map_index")


def pins_key(identity: Mapping[str, Any]) -> str:
    """Where a task instance's pins live."""
    return f"{PINS_PREFIX}/{task_key(identity)}.json"


@dataclass(frozen=True)
class Pin:
    """One ``kinetic://`` Data of a try: its key and the version it reads."""

    key: str
    version: str
    #: "pinned" (the Data named it), "recorded" (an earlier try of this run resolved
    #: it) or "resolved" (the key's current version, now recorded).
    source: str

    def row(self) -> dict[str, str]:
        return {"key": self.key, "version": self.version, "source": self.source}


def same_run_instance(recorded: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> bool:
    """Whether a record made in the run instance ``recorded`` is this one's (``now``),
    each ``{"clear_number", "run_start", "try_number", "ti_id"}``.  Within one instance
    the run's clear number and the task's try number never go down, a run start
    changes only with a clear (which adds to the clear number), and a try keeps its
    task instance id (a deferral's resume too); so a lower number, or the same number
    with another start or id, is a new instance.  A record (or a caller) without the
    fields counts as the same, as before them."""
    if not recorded or not now:
        return True
    for count, tie in (("clear_number", "run_start"), ("try_number", "ti_id")):
        was, is_ = int(recorded.get(count) or 0), int(now.get(count) or 0)
        if is_ < was or (is_ == was and str(recorded.get(tie)) != str(now.get(tie))):
            return False
    return True


def read_pins(
    store: ObjectStore, identity: Mapping[str, Any], instance: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The recorded ``{key: version}`` of a task instance (empty: none yet, or only
    an earlier run instance's under the same ids)."""
    try:
        body = json.loads(store.read_bytes(pins_key(identity)))
    except ObjectNotFound:
        return {}
    if not same_run_instance(body.get("instance"), instance):
        return {}
    return {str(k): str(v) for k, v in (body.get("pins") or {}).items()}


def pinned(store: ObjectStore) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """``(key, version)`` -> the task instances whose pin records name that version
    (a retry or clear of each reads it, whatever the key's current version): every
    record in ``store``, read on the store's threads."""
    names = [n for n in store.list(f"{PINS_PREFIX}/") if n.endswith(".json")]
    if not names:
        return {}
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with ThreadPoolExecutor(store.workers_for(len(names), 0)) as pool:
        for body in pool.map(lambda name: _record(store, name), names):
            ident = body.get("identity") or {}
            who = {k: ident.get(k) for k in PIN_IDENTITY}
            for key, version in (body.get("pins") or {}).items():
                found.setdefault((str(key), str(version)), []).append(who)
    for pins in found.values():
        pins.sort(key=lambda who: tuple(str(who[k]) for k in PIN_IDENTITY))
    return found


def _record(store: ObjectStore, name: str) -> dict[str, Any]:
    """One pin record ({} for one removed meanwhile or unreadable)."""
    try:
        body = json.loads(store.read_bytes(name))
    except (ObjectNotFound, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def pin_values(
    store: ObjectStore,
    identity: Mapping[str, Any],
    values: list[Any],
    instance: Mapping[str, Any] | None = None,
) -> tuple[list[Any], list[Pin]]:
    """``values`` (op_args, op_kwargs, volumes...) with every ``kinetic://`` Data
    pinned to one version, and the pins (one per key, in order of appearance);
    ``instance`` tells this run instance from an earlier one of the same ids (see the
    module).  Raises ``KeyNotFound`` (naming the key and the nearest keys) before
    anything is written when a key or version is missing."""
    recorded = read_pins(store, identity, instance)
    keys = KeyStore(store)
    pins: dict[str, Pin] = {}
    fresh: dict[str, str] = {}

    def leaf(value: Any) -> Any:
        if not isinstance(value, Data) or not value.path.startswith(PREFIX):
            return KEEP
        key, version = parse_ref(key_ref(value.path))
        if version is not None:
            _, found = keys.resolve(key, version)
            pin = Pin(key, found.version, "pinned")
        elif key in fresh:
            pin = Pin(key, fresh[key], "resolved")
        elif key in recorded:
            pin = Pin(key, recorded[key], "recorded")
        else:
            _, found = keys.resolve(key)
            fresh[key] = found.version
            pin = Pin(key, found.version, "resolved")
        pins.setdefault(f"{pin.key}@{pin.version}", pin)
        return Data(
            f"{PREFIX}{key}@{pin.version}",
            fuse=value.fuse,
            hf_trust_remote_code=value.hf_trust_remote_code,
        )

    out = [map_leaves(v, leaf) for v in values]
    if fresh:
        body = {"format": 1, "identity": dict(identity), "pins": {**recorded, **fresh}}
        if instance:
            body["instance"] = dict(instance)
        text = json.dumps(body, sort_keys=True, default=str)
        store.write_bytes(pins_key(identity), text.encode())
    return out, list(pins.values())
