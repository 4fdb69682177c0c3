"""What takes over from a job that ended in a KineticRunOperator try, decided here and
done by ``operators.task_try.TaskTry.next_job``:

- the task's next capacity step (``core.jobs.fallback``), when the job's step found no
  capacity and nothing of it ever started;
- a re-submit of a job that failed with a class its ``retry_on`` still has re-submits
  for (``core.jobs.retry_on``: preemptions by default, ``preemption_retries`` of them;
  counted per class in its record, across tries; the task's Airflow ``retries`` are
  not used);
- nothing: the try finishes the job as it ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends.registry import MULTI_SLICE
from airflow_provider_kinetic.core.catalog.capacity import chain_for
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.fallback import describe_step, next_step
from airflow_provider_kinetic.core.jobs.finish import failure_of
from airflow_provider_kinetic.core.jobs.retry_on import RetryOn, parse_retry_on
from airflow_provider_kinetic.core.jobs.taskrecord import TaskRecord
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.signing import result_key
from airflow_provider_kinetic.operators.capacity import request_fields as capacity_fields
from airflow_provider_kinetic.operators.task_record import preemptions_of, resubmits_of


@dataclass
class Takeover:
    """A new job takes over from an ended one: capacity step ``step``, or (``None``) a
    failed job's re-submit; ``preemptions``: the task's count once it is submitted;
    ``resubmits``: its re-submits per class then; ``failure``: what failed (a re-submit)."""

    step: int | None
    preemptions: int
    resubmits: dict[str, int] = field(default_factory=dict)
    failure: Failure | None = None

    @property
    def preempted(self) -> bool:
        """A re-submit (of a preempted job, or of any class ``retry_on`` re-submits)."""
        return self.step is None


def resubmit_policy(op: Any) -> RetryOn:
    """The task's ``retry_on`` (as rendered) with its ``preemption_retries``."""
    return parse_retry_on(op.retry_on, preemption_retries=op.preemption_retries)


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
    counts = resubmits_of(record)
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
        return Takeover(step, used, counts)
    if report.status is JobStatus.SUCCEEDED:
        return None
    policy = resubmit_policy(op)
    failure = failure_of(store, handle, report, result_key(handle), policy.exit_codes)
    if failure is None:  # it left a good result after all
        return None
    kind = failure.failure_class
    budget, done = policy.budget(kind), counts.get(kind.value, 0)
    preempted = kind is FailureClass.PREEMPTION
    what = f"was preempted ({report.describe()})" if preempted else failure.describe()
    if handle.backend == MULTI_SLICE and kind in (FailureClass.PREEMPTION, FailureClass.INFRA):
        # Its JobSet spent these re-submits restarting the whole gang in place (maxRestarts).
        log.warning("kinetic job %s %s after its JobSet's restarts", handle.job_id, what)
        return None
    if done >= budget:
        if budget or preempted:
            log.warning(
                "kinetic job %s %s and the task's %d %s re-submits are used up",
                handle.job_id,
                what,
                budget,
                kind.value,
            )
        return None
    log.warning(
        "kinetic job %s %s: submitting it again (%s %d/%d; the task's Airflow retries "
        "are not used)",
        handle.job_id,
        what,
        "preemption retry" if preempted else f"{kind.value} re-submit",
        done + 1,
        budget,
    )
    counts[kind.value] = done + 1
    preemptions = used + 1 if kind is FailureClass.PREEMPTION else used
    return Takeover(None, preemptions, counts, failure)
