"""Airflow ids as store keys: readable where they can be, exact always.

Store keys and output dirs are built from a task's dag id, run id, task id and map
index.  Characters outside ``[A-Za-z0-9._=-]`` cannot stay (``:``, ``+``, spaces and
non-ASCII letters would need escaping in URIs and labels), and replacing them alone is
not injective: ``exp:1``, ``exp+1`` and ``exp~1`` would all become ``exp_1``, so two
runs would share one record and one output dir.  So an id made only of safe characters
is its own key; any other id is its readable form plus ``~`` and 16 hex digits of its
SHA-256 (``~`` is never in a kept id, so the two forms cannot meet)::

    scheduled__2026-11-25                -> scheduled__2026-11-25
    manual__2026-11-25T06:00:00+00:00    -> manual__2026-11-25T06_00_00_00_00~3b2f...
    学习                                  -> _~9c1e...
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

_SAFE = re.compile(r"[A-Za-z0-9._=-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")
#: Length of the readable part of an escaped id (Airflow ids are at most 250 chars).
_READABLE = 100


def ti_identity(ti: Any) -> dict[str, Any]:
    """An Airflow task instance's ids, exact (duck-typed: no Airflow import here): the
    identity task records, output dirs and labels are made from."""
    return {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "map_index": getattr(ti, "map_index", -1),
        "try_number": getattr(ti, "try_number", None),
    }


def key_part(value: Any) -> str:
    """``value`` as one path segment of a store key (see the module docstring)."""
    text = str(value)
    if _SAFE.fullmatch(text) and text not in (".", ".."):
        return text
    readable = _UNSAFE.sub("_", text)[:_READABLE]
    return f"{readable}~{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def task_parts(identity: Mapping[str, Any]) -> list[str]:
    """dag id, run id, task id and map index of a task (``-1``: not mapped)."""
    return [
        str(identity["dag_id"]),
        str(identity["run_id"]),
        str(identity["task_id"]),
        str(identity.get("map_index", -1)),
    ]


def task_key(identity: Mapping[str, Any]) -> str:
    """``{dag}/{run}/{task}/{map_index}``, each part by :func:`key_part`."""
    return "/".join(key_part(p) for p in task_parts(identity))


def exact_identity(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The ids a record keeps verbatim (no try number: it changes every try)."""
    return {
        "dag_id": str(identity["dag_id"]),
        "run_id": str(identity["run_id"]),
        "task_id": str(identity["task_id"]),
        "map_index": int(identity.get("map_index", -1)),
    }
