"""Inside a job: the store and the identity come from the job's own environment.

Every backend's runner gets ``JOB_ID`` and ``GCS_BUCKET`` (``core/spec/pod.py``):
the bucket name on GKE, the store root's absolute path on the local backend.  So a
remote function can use keys with no Airflow connection (a pod has no Airflow).
Who put it: the job id (and batch index) from the same environment.
"""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_kinetic.core.spec.peerport import SCOPE_ENV
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore

JOB_ENV = "JOB_ID"
BUCKET_ENV = "GCS_BUCKET"
GROUP_INDEX_ENV = "KINETIC_GROUP_INDEX"


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


def job_who() -> dict[str, Any]:
    """The job id and its batch index (the Airflow identity is added by the caller
    that may read the job history, ``keys.py``)."""
    who: dict[str, Any] = {"job_id": os.environ.get(JOB_ENV, "")}
    if os.environ.get(GROUP_INDEX_ENV):
        who["group_index"] = int(os.environ[GROUP_INDEX_ENV])
    return who


def peer_scope() -> str | None:
    """The scope this job's peers share (``KINETIC_PEER_SCOPE``, set on every job by
    ``jobs/template.py``): its batch id for a batch's children, else its job id, which
    every host of an LWS job shares.  File and tensor broadcasts use this one scope,
    so two batches never meet.  None outside a job (or in a job that names none)."""
    if not in_job():
        return None
    return os.environ.get(SCOPE_ENV) or None
