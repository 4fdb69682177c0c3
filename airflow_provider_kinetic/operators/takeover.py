"""What takes over from a job that ended in a KineticRunOperator try, decided here and
done by ``operators.task_try.TaskTry.next_job``:

- the task's next capacity step (``core.jobs.fallback``), when the job's step found no
  capacity and nothing of it ever started;
- a re-submit of a job the platform killed (spot reclaim, eviction) while the task's
  ``preemption_retries`` last (counted in its record, across tries; the task's Airflow
  ``retries`` are not used);
- nothing: the try finishes the job as it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.catalog.capacity import chain_for
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.fallback import describe_step, next_step
from airflow_provider_kinetic.core.jobs.results import is_preemption
from airflow_provider_kinetic.core.jobs.taskrecord import TaskRecord
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.operators.capacity import request_fields as capacity_fields
from airflow_provider_kinetic.operators.task_record import preemptions_of


@dataclass
class Takeover:
    """A new job takes over from an ended one: capacity step ``step``, or (``None``) a
    preempted job's re-submit; ``preemptions``: the task's count once it is submitted."""

    step: int | None
    preemptions: int

    @property
    def preempted(self) -> bool:
        return self.step is None


def capacity_chain(op: Any, config: KineticConfig) -> list[str]:
    """The task's capacity steps as rendered (the connection's default when the task
    names none): the same chain the task's jobs were planned with."""
    fields = capacity_fields(op.capacity, op.capacity_wait, op.priority_class, op.max_run_duration)
    chain = chain_for(fields["capacity"], op.accelerator_spec(), config.capacity)
    return [str(step) for step in chain]


def takeover(
    op: Any,
    config: KineticConfig,
    store: ObjectStore,
    record: TaskRecord | None,
    handle: JobHandle,
    report: StatusReport,
    log: Any,
) -> Takeover | None:
    """What takes over from ``handle``, which ended with ``report`` (None: nothing)."""
    used = preemptions_of(record)
    chain = capacity_chain(op, config)
    step = next_step(chain, handle, report, store)
    if step is not None:
        log.warning(
            "kinetic job %s: giving up %s: %s; trying %s",
            handle.job_id,
            describe_step(chain, step - 1),
            report.message,
            describe_step(chain, step),
        )
        return Takeover(step, used)
    if not is_preemption(report, store, handle):
        return None
    if used >= op.preemption_retries:
        log.warning(
            "kinetic job %s was preempted (%s) and the task's %d preemption retries are used up",
            handle.job_id,
            report.describe(),
            op.preemption_retries,
        )
        return None
    log.warning(
        "kinetic job %s was preempted (%s): submitting it again (preemption retry %d/%d; "
        "the task's Airflow retries are not used)",
        handle.job_id,
        report.describe(),
        used + 1,
        op.preemption_retries,
    )
    return Takeover(None, used + 1)
