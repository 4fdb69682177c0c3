"""Data: what a function reads.  ``Data`` (value.py), its schemes (local path, file://,
gs://, hf://), kinetic's content hash with its stat cache (hashing/), the data cache,
the ref wire form and volume mounts.  Uses storage/ and errors only: never jobs,
backends or Airflow.

Inside: refs, mounts, locallinks and hashing/ at the bottom; schemes/ on them (they see
``Data`` through a protocol); value.py on schemes; cache.py on value.  This module
re-exports the names the rest of the package uses, so ``core.data.Data`` is the path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_kinetic.core.data.refs import KEEP, is_data_ref, make_data_ref, map_leaves

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.data.hashing.treewalk import (
        DataPathError,
        DataReadError,
    )
    from airflow_provider_kinetic.core.data.value import (
        Data,
        content_hash_of,
        content_hash_tree,
        iter_tree,
    )

__all__ = [
    "KEEP",
    "Data",
    "DataPathError",
    "DataReadError",
    "content_hash_of",
    "content_hash_tree",
    "iter_tree",
    "is_data_ref",
    "make_data_ref",
    "map_leaves",
]

#: Names resolved on first use: ``Data`` and the hash pull in the hashing stack and the
#: schemes (~25 ms of imports), which a job's runner needs only when its call holds
#: Data refs; the ref helpers above are what every runner uses.
_LAZY = {
    "Data": "value",
    "content_hash_of": "value",
    "content_hash_tree": "value",
    "iter_tree": "value",
    "DataPathError": "hashing.treewalk",
    "DataReadError": "hashing.treewalk",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value
