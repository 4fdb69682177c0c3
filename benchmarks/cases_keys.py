"""Keys: ``store.put`` of an unchanged tree costs about what re-hashing it costs.

The goal (issue 27): a put of an unchanged 20,000-file directory within 1.5x of the
provider's own re-hash of it, with zero uploads.  Both sides run in this process with
the same warm stat cache; ``put`` adds the data cache's marker check and one
compare-and-swap of the key's pointer on a local root.
"""

from __future__ import annotations

import os
from pathlib import Path

from table import Row, best

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import LocalStore

GOAL = 0.67  # rehash time / put time: 1/1.5, rounded up


def unchanged_put(tree: Path, n: int, repeat: int, tmp: Path) -> Row:
    saved = os.environ.get("KINETIC_STATCACHE_DIR")
    os.environ["KINETIC_STATCACHE_DIR"] = str(tmp / "keys-statcache")
    try:
        store = LocalStore(str(tmp / "keys-root"))
        keys = KeyStore(store)
        first = keys.put("bench/tree", tree)  # uploads once, warms the stat cache
        objects = len(store.list(""))
        t_hash, digest = best(lambda: Data(str(tree)).content_hash(), repeat)
        t_put, rows = best(lambda: [keys.put("bench/tree", tree)], repeat)
    finally:
        if saved is None:
            os.environ.pop("KINETIC_STATCACHE_DIR", None)
        else:
            os.environ["KINETIC_STATCACHE_DIR"] = saved
    uploads = sum(bool(r["uploaded"]) for r in rows) + (len(store.list("")) - objects)
    same = first["version"] == digest == rows[-1]["version"]
    row = Row.timed(
        f"store.put unchanged {n:,} files", "re-hash", t_hash, t_put, GOAL,
        f"uploads after the first put: {uploads} (goal 0); the version is the re-hash: {same}",
    )  # fmt: skip
    row.passed = bool(row.passed) and uploads == 0 and same
    return row
