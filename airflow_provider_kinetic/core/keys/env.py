"""Inside a job: the store and the identity come from the job's own environment.

Every backend's runner gets ``JOB_ID`` and ``GCS_BUCKET`` (``core/spec/pod.py``):
the bucket name on GKE, the store root's absolute path on the local backend.  So a
remote function can use keys with no Airflow connection (a pod has no Airflow).
Who put it comes from the job's handle in the store (dag, task, run, map index),
which the submitter wrote before the job started.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore, StoreUnavailable

JOB_ENV = "JOB_ID"
BUCKET_ENV = "GCS_BUCKET"
GROUP_INDEX_ENV = "KINETIC_GROUP_INDEX"
_IDENTITY = ("dag_id", "task_id", "run_id", "map_index")


def in_job() -> bool:
    """Whether this process is a kinetic job (its runner set the job's env)."""
    return bool(os.environ.get(JOB_ENV) and os.environ.get(BUCKET_ENV))


def job_store() -> ObjectStore:
    """The store the job was given."""
    bucket = os.environ.get(BUCKET_ENV, "")
    if bucket.startswith("/"):
        return LocalStore(bucket)
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    return GcsStore(bucket)


def job_who(store: ObjectStore) -> dict[str, Any]:
    """The job id, its batch index, and the Airflow identity its handle records."""
    who: dict[str, Any] = {"job_id": os.environ.get(JOB_ENV, "")}
    if os.environ.get(GROUP_INDEX_ENV):
        who["group_index"] = int(os.environ[GROUP_INDEX_ENV])
    try:
        handle = json.loads(store.read_bytes(artifact_key(who["job_id"], "handle.json")))
    except (OSError, ValueError, StoreUnavailable):
        return who
    identity = handle.get("identity") or {}
    who.update({k: identity[k] for k in _IDENTITY if k in identity})
    return who
