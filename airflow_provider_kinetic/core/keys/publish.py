"""``output_key``: a finished job's output dir becomes a key's new version.

Why here and not in the runner: the version must appear only once the job has
*succeeded* and its value was delivered (a job that fails after writing half its
files must never move the key), and that is known where the job is collected.

Idempotent per task instance: a retry that collects the same job again, or a job
whose output is byte-for-byte what this task already put, makes no new version (the
same content hash is already the key's current version, or a kept version this task
instance put); the existing row is returned with ``new: False``, and the key's ttl
is renewed (``KeyStore.renew``): unchanged output each day keeps the key alive.

The content is hashed locally, exactly as ``store.put`` hashes it: on the local
backend the output dir *is* a local directory; a ``gs://`` output dir is downloaded
to a temporary directory first (GCS keeps no SHA-256 of an object, so its bytes
must be read to be hashed), then put (the data cache upload).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path, store_for_uri

_SAME_TASK = ("dag_id", "task_id", "run_id", "map_index")

#: ``output_key_policy``: keys move forward in logical date (the default), or to
#: whichever run finished last (the behaviour of earlier versions).
NEWEST_LOGICAL_DATE = "newest_logical_date"
LAST_FINISHER = "last_finisher"
POLICIES = (NEWEST_LOGICAL_DATE, LAST_FINISHER)


def check_policy(value: Any) -> str:
    """``output_key_policy`` as given; a ValueError naming it and the allowed values."""
    if value not in POLICIES:
        allowed = " or ".join(repr(p) for p in POLICIES)
        raise ValueError(f"output_key_policy must be {allowed}, got {value!r}")
    return str(value)


class OutputKeyError(KineticError, RuntimeError):
    """The job succeeded but its output dir cannot become the key's version."""


def publish_output(
    keys: KeyStore,
    key: str,
    output_uri: str,
    who: Mapping[str, Any],
    policy: str = NEWEST_LOGICAL_DATE,
) -> dict[str, Any]:
    """Put the directory ``output_uri`` under ``key`` (see the module docstring);
    the version's row with ``new`` (False: this content was there already).

    ``policy`` ``newest_logical_date``: a version of an earlier logical date than the
    key's current one (``who["logical_date"]``; a catchup or backfill run finishing
    after a newer run) is kept aside, stored and listed, and the row says ``aside``
    and why; ``last_finisher``: the key moves to every new version."""
    forward_only = check_policy(policy) == NEWEST_LOGICAL_DATE
    tmp = tempfile.mkdtemp(prefix="kinetic-output-key-")
    try:
        path = _local_dir(keys.store, output_uri, tmp)
        if not os.path.isdir(path) or not any(os.scandir(path)):
            raise OutputKeyError(
                f"output_key {key!r}: the job wrote nothing to its output dir {output_uri}; "
                "the key was not changed"
            )
        digest = Data(path).content_hash()
        state = keys.state(key)
        for v in state.versions if state is not None else []:
            mine = all(str(v.by.get(k)) == str(who.get(k)) for k in _SAME_TASK)
            if v.version == digest and (v is state.current or mine):  # type: ignore[union-attr]
                # No new version, but a publish: the key's ttl counts from now.
                keys.renew(key, digest)
                row = v.row(key)
                row["new"] = False
                return row
        writer = KeyStore(keys.store, who=lambda: dict(who), keep=keys.keep)
        row = writer.put(key, path, forward_only=forward_only)
        row["new"] = True
        return row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _local_dir(store: ObjectStore, uri: str, tmp: str) -> str:
    """A local directory holding the output dir's files."""
    if uri.startswith("file://"):
        return file_uri_path(uri.rstrip("/"))
    base = store.uri().rstrip("/") + "/"
    if uri.startswith(base):
        source, prefix = store, uri[len(base) :].strip("/")
    else:
        source, prefix = store_for_uri(uri.rstrip("/"))
    target = os.path.join(tmp, "output")
    source.download_prefix(prefix, target)
    return target
