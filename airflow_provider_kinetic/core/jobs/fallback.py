"""Capacity fallback: when a job's capacity step is given up, and what comes next.

The backend's status read turns a step whose pods stayed unschedulable (or unadmitted
by Kueue) past its wait into FAILED / ``REASON_NO_CAPACITY`` (``backends.k8s_capacity``).
Here the task (a single job, or a batch child) decides whether to go on: only with a
step left, and only when the store shows that the runner of the job never started
(its ``started.json``, written first thing): the cluster's view alone could miss a pod
that ran and was deleted, and the function must never run twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_kinetic.core.catalog.capacity import parse_capacity
from airflow_provider_kinetic.core.jobs.checkpoint import STARTED_NAME
from airflow_provider_kinetic.core.spec.handles import (
    REASON_NO_CAPACITY,
    JobHandle,
    StatusReport,
    artifact_key,
)
from airflow_provider_kinetic.core.storage import ObjectStore


def step_of(chain: Sequence[str], handle: JobHandle) -> int:
    """The index of the step ``handle`` was made for (0 for a job from before chains)."""
    try:
        return list(chain).index(handle.capacity) if handle.capacity else 0
    except ValueError:  # the chain changed between tries: the handle's step is unknown
        return 0


def runner_started(store: ObjectStore, job_id: str) -> bool:
    """Whether the job's runner ever started (its start record exists); a store that
    cannot be read counts as started, so nothing is ever run a second time."""
    try:
        return store.exists(artifact_key(job_id, STARTED_NAME))
    except Exception:  # noqa: BLE001 - unknown: assume it ran
        return True


def next_step(
    chain: Sequence[str], handle: JobHandle, report: StatusReport, store: ObjectStore
) -> int | None:
    """The step to try now that ``handle``'s step ended with ``report``; None: none
    (not a capacity ending, no step left, or the runner started after all)."""
    if report.reason != REASON_NO_CAPACITY:
        return None
    step = step_of(chain, handle)
    if step + 1 >= len(chain) or runner_started(store, handle.job_id):
        return None
    return step + 1


def describe_step(chain: Sequence[str], step: int) -> str:
    """The step as the task log says it: reservation r1 (capacity step 1 of 3)."""
    return f"{parse_capacity(chain[step]).describe} (capacity step {step + 1} of {len(chain)})"
