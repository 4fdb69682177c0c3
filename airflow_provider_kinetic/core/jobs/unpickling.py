"""Reading pickles this package wrote, including those written before a module moved.

Payloads, batch inputs and results are pickles in the store, and a pickle names the
classes and functions it holds by module path (a batch payload's guard function, an
exception of this package inside a failure).  A deployment upgraded while jobs run
reads pickles an older version wrote, so each module this package moved keeps its
old path here: a name that is not found where the pickle says is looked up where its
module went.  Everything else unpickles exactly as ``cloudpickle.loads`` does.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

_CORE = "airflow_provider_kinetic.core."

#: Old module path -> where it lives now (the package layout of 0.1.0's first wheels).
MOVED_MODULES: dict[str, str] = {
    _CORE + old: _CORE + new
    for old, new in {
        "data": "data.value",
        "treewalk": "data.hashing.treewalk",
        "treehash": "data.hashing.treehash",
        "statcache": "data.hashing.statcache",
        "statrecord": "data.hashing.statrecord",
        "fastlstat": "data.hashing.fastlstat",
        "datacache": "data.cache",
        "schemes": "data.schemes",
        "schemes.base": "data.schemes.base",
        "schemes.local": "data.schemes.local",
        "schemes.gcs": "data.schemes.gcs",
        "schemes.hf": "data.schemes.hf",
        "schemes.hf_load": "data.schemes.hf_load",
        "mounts": "data.mounts",
        "locallinks": "data.locallinks",
        "handles": "spec.handles",
        "jobspec": "spec.pod",
        "payload": "jobs.payload",
        "batchwire": "jobs.batchwire",
        "template": "jobs.template",
        "submit": "jobs.submit",
        "signing": "jobs.signing",
        "polling": "jobs.polling",
        "results": "jobs.results",
        "resultref": "jobs.resultref",
        "taskrecord": "jobs.taskrecord",
        "batch": "batch.plan",
        "batchrun": "batch.run",
        "batchresume": "batch.resume",
        "batchstate": "batch.state",
        "batchlogs": "batch.logs",
    }.items()
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            moved = MOVED_MODULES.get(module)
            if moved is None:
                raise
            return super().find_class(moved, name)


def loads(blob: bytes) -> Any:
    """``cloudpickle.loads``, with this package's moved modules found at their new paths."""
    return _Unpickler(io.BytesIO(blob)).load()
