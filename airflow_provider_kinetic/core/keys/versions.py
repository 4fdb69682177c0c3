"""``ls(prefix, versions=True)``: every kept version of each key under a prefix,
newest first, with the task instances that pinned it.

Why: a key's plain ``ls`` row shows its current version and how many are kept, so an
older version was reachable only through a hash noted at ``put`` time.  A key's
state object holds its whole kept history (``records.py``: the last
``store_keep_versions``, newest first), so the versions cost one read per key, as
``ls`` does; the pins are the task instances' pin records (``pins.py``), read once
for the whole listing.  A pinned version is one a retry or clear of that task reads.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.pins import pinned


def ls_versions(keys: KeyStore, prefix: str = "") -> list[dict[str, Any]]:
    """One row per kept version of every key ``keys.ls(prefix)`` lists, by key, each
    key's newest first: the version's row (key, version, time, size, files, kind,
    by), ``current`` (the key's current version) and ``pins`` (the task instances
    whose pin records name it: dag_id, run_id, task_id, map_index)."""
    states = keys.states(prefix)
    pins = pinned(keys.store) if states else {}
    rows = []
    for state in states:
        for i, version in enumerate(state.versions):
            row = version.row(state.key)
            row["current"] = i == 0
            row["pins"] = pins.get((state.key, version.version), [])
            rows.append(row)
    return rows
