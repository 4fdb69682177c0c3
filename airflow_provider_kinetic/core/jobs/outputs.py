"""A try owns its output: the output dir a new job sees starts empty.

The default output dir is stable per task run (``outputs/{dag}/{run}/{task}/{map}``),
so every job of the run writes into the same place: a try that crashed after writing
a shard, then a retry that wrote the model, left both there, and ``output_key``
published both.  So before a *new* job is created (never when a job is adopted), the
output dir it will write is emptied: a single job's dir at submit (a retry, a
preemption's resubmit, a capacity step), a batch's whole dir when a new batch starts,
one child's ``{index}`` dir when that input is launched again.

Only dirs this package names are emptied: those under the store's ``outputs/``.  A
dir the user gave elsewhere (``output_dir="gs://bucket/models/"``) may hold anything
(other tasks' files, the bucket root): it is left as it is, and the log says so.
"""

from __future__ import annotations

import logging

from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)

#: The store prefix of the output dirs this package names (and may empty).
OUTPUTS = "outputs/"


def owned_prefix(store: ObjectStore, output_uri: str) -> str | None:
    """The store key prefix of ``output_uri`` when it lies under the store's
    ``outputs/`` (a dir this package named), else None."""
    base = store.uri(OUTPUTS).rstrip("/") + "/"
    uri = output_uri.rstrip("/") + "/"
    if not uri.startswith(base) or uri == base:
        return None
    return OUTPUTS + uri[len(base) :].rstrip("/")


def start_empty(store: ObjectStore, output_uri: str, who: str) -> int:
    """Empty ``output_uri`` before a new job (``who``, for the log) writes into it;
    returns the objects removed.  A dir outside the store's ``outputs/`` is kept."""
    prefix = owned_prefix(store, output_uri)
    if prefix is None:
        log.info(
            "%s: output dir %s is not under the store's %s: not emptied (files an "
            "earlier job left there stay, and output_key would publish them too)",
            who,
            output_uri,
            OUTPUTS,
        )
        return 0
    removed = store.delete_prefix(prefix)
    if removed:
        log.info(
            "%s: output dir %s held %d files an earlier job left; removed them (a try "
            "owns its output: output_key publishes only what this job writes)",
            who,
            output_uri,
            removed,
        )
    return removed
