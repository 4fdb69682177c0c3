"""Job identity on the wire: the JobHandle dict, JobStatus, and id generation.

Handles are plain JSON dicts (kinetic 0.0.4's ``JobHandle.to_dict()`` keys plus our
own additive ``version`` key) because they travel through XCom, trigger kwargs and
``handle.json``; a dataclass would need serde allow-listing in Airflow.
"""

from __future__ import annotations

import enum
import json
import uuid
from datetime import UTC, datetime
from typing import Any

HANDLE_VERSION = 1

#: kinetic's JobHandle fields, in order; all but the group fields are required.
HANDLE_FIELDS = (
    "job_id",
    "backend",
    "project",
    "cluster_name",
    "zone",
    "namespace",
    "bucket_name",
    "k8s_name",
    "image_uri",
    "accelerator",
    "func_name",
    "display_name",
    "created_at",
)
GROUP_FIELDS = ("group_id", "group_kind", "group_index")


class JobStatus(enum.StrEnum):
    """Lifecycle of one job; values equal the names (as kinetic's enum)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    NOT_FOUND = "NOT_FOUND"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.NOT_FOUND)


def new_job_id() -> str:
    return "job-" + uuid.uuid4().hex[:8]


def new_group_id() -> str:
    return "grp-" + uuid.uuid4().hex[:8]


def utc_now_iso() -> str:
    """ISO-8601 UTC at seconds precision with a ``Z`` suffix (kinetic's created_at)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_handle(**fields: Any) -> dict[str, Any]:
    """Build a handle dict as kinetic's ``to_dict`` would.

    kinetic's required fields are strings (a missing project on the local backend
    becomes ``""``); optional ``None`` values are dropped.
    """
    missing = [k for k in HANDLE_FIELDS if k not in fields]
    if missing:
        raise TypeError(f"JobHandle is missing fields: {', '.join(missing)}")
    handle = {k: ("" if v is None and k in HANDLE_FIELDS else v) for k, v in fields.items()}
    handle = {k: v for k, v in handle.items() if v is not None}
    handle.setdefault("debug", False)
    handle["version"] = HANDLE_VERSION
    return handle


def validate_handle(handle: Any) -> dict[str, Any]:
    """Check a dict read back from XCom / handle.json; unknown keys are kept."""
    if not isinstance(handle, dict):
        raise TypeError(f"JobHandle must be a dict, got {type(handle).__name__}")
    missing = [k for k in ("job_id", "backend", "bucket_name") if k not in handle]
    if missing:
        raise TypeError(f"JobHandle dict is missing {', '.join(missing)}: {handle!r}")
    return handle


def handle_to_json(handle: dict[str, Any]) -> bytes:
    """``handle.json`` bytes exactly as kinetic writes them (sorted keys)."""
    return json.dumps(handle, sort_keys=True).encode("utf-8")


def artifact_key(job_id: str, name: str) -> str:
    """Key of a job artifact in the jobs bucket: ``{job_id}/{name}``."""
    return f"{job_id}/{name}"
