"""Data: what a function reads.  ``Data`` (value.py), its schemes (local path, file://,
gs://, hf://), kinetic's content hash with its stat cache (hashing/), the data cache,
the ref wire form and volume mounts.  Uses storage/ and errors only: never jobs,
backends or Airflow.

Inside: refs, mounts, locallinks and hashing/ at the bottom; schemes/ on them (they see
``Data`` through a protocol); value.py on schemes; cache.py on value.  This module
re-exports the names the rest of the package uses, so ``core.data.Data`` is the path.
"""

from __future__ import annotations

from airflow_provider_kinetic.core.data.hashing.treewalk import DataPathError, DataReadError
from airflow_provider_kinetic.core.data.refs import KEEP, is_data_ref, make_data_ref, map_leaves
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
