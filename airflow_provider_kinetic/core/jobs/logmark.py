"""How far a deferral has shown its job's log: the offset a re-created trigger continues from.

Airflow stores a trigger's kwargs once, at the deferral, and re-creates the trigger
from them after a triggerer restart (or when another triggerer takes it over): the
``log_offset`` there is the deferral's, so the new trigger would show again every line
the old one had shown.  The old trigger therefore saves where it got to, in the job's
dir (``{job_id}/log_shown.json``), tagged with its deferral (``not_before``, set once
at the deferral and carried in the kwargs); the re-created trigger reads it and
continues from there.  A later deferral (a new try, a re-deferral) has another tag
and starts from its own kwargs: its task log is another file.

Saved when a trigger is stopped (the triggerer cancels it) and at most every
``SAVE_EVERY_S`` while lines flow, so a triggerer killed outright repeats at most that
much; a stopped one repeats nothing.  The mark is an account: reading or writing it
never fails the wait.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

LOG_MARK_NAME = "log_shown.json"
#: Seconds between two saves of a running trigger's mark (one small store write).
SAVE_EVERY_S = 30.0


def mark_key(job_id: str) -> str:
    """``{job_id}/log_shown.json``: the job's dir is ``{job_id}/`` in the store."""
    return f"{job_id}/{LOG_MARK_NAME}"


@dataclass(frozen=True)
class LogMark:
    """The log offset deferral ``deferral`` (its ``not_before``) has shown up to."""

    deferral: float
    offset: int


def save(store: ObjectStore, job_id: str, mark: LogMark) -> None:
    """Write ``mark`` (the latest deferral's only: one object per job)."""
    data = json.dumps({"deferral": mark.deferral, "offset": mark.offset}).encode()
    try:
        store.write_bytes(mark_key(job_id), data, content_type="application/json")
    except Exception as exc:  # noqa: BLE001 - an account: a repeat at worst
        log.warning("could not save how far job %s's log was shown: %s", job_id, exc)


def load(store: ObjectStore, job_id: str, deferral: float) -> int | None:
    """The offset deferral ``deferral`` saved for ``job_id``; None when it saved none
    (another deferral's mark, none yet, or unreadable)."""
    try:
        raw = json.loads(store.read_bytes(mark_key(job_id)))
        if float(raw["deferral"]) != float(deferral):
            return None
        return int(raw["offset"])
    except ObjectNotFound:
        return None
    except Exception as exc:  # noqa: BLE001 - an account: a repeat at worst
        log.warning("could not read how far job %s's log was shown: %s", job_id, exc)
        return None
