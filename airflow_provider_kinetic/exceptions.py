"""Errors an Airflow task raises when its kinetic job did not deliver a value.

They are ``AirflowException`` subclasses (so Airflow's retry rules apply as usual)
and ``KineticError`` subclasses (so ``except KineticError`` catches every kinetic
failure, core or Airflow layer).  The remote exception, when there is one, is the
``__cause__`` and its traceback is in the notes.

A failed job raises the subclass of :class:`KineticJobFailed` its failure's class
names (``core.spec.failure``): :class:`KineticUserError`, :class:`KineticInfraError`,
:class:`KineticPreempted`, :class:`KineticNoCapacity`, :class:`KineticTimeout`,
:class:`KineticJobCancelled`, :class:`KineticStoreError`; each carries the
``Failure`` (class, phase, exit code, host, job id, the remote exception as strings),
so an Airflow 3.3 ``retry_policy`` can act on the type.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass


class KineticJobFailed(KineticError, AirflowException):
    """The job ran and failed (the function raised, or the platform killed it).

    ``failure``: what failed (``core.spec.failure.Failure``), when it is known."""

    def __init__(self, message: str, *, job_id: str | None = None, failure: Failure | None = None):
        super().__init__(message)
        self.job_id = job_id or (failure.job_id if failure is not None else None)
        self.failure = failure

    @property
    def failure_class(self) -> FailureClass | None:
        return self.failure.failure_class if self.failure is not None else None

    @property
    def phase(self) -> str | None:
        return self.failure.phase if self.failure is not None else None


class KineticUserError(KineticJobFailed):
    """The function raised (``user_error``): a re-run of the same work fails again."""


class KineticInfraError(KineticJobFailed):
    """The platform or the job's environment failed (``infra``): an image pull, out of
    memory, a crash outside the function, a lost node, an eviction, a failing
    requirements install, a Data input that cannot be read."""


class KineticPreempted(KineticJobFailed):
    """The machine was taken away (``preemption``): a spot reclaim, a node shutdown."""


class KineticNoCapacity(KineticJobFailed):
    """No capacity came within the capacity wait (``no_capacity``)."""


class KineticStoreError(KineticJobFailed):
    """The store could not be read or written (``store``)."""


class KineticJobCancelled(KineticJobFailed):
    """The job was cancelled (``cancelled``): a person, the trigger gave up, or the
    task's execution_timeout (then the subclass :class:`KineticTimeout`)."""


class KineticTimeout(KineticJobCancelled):
    """The task's execution_timeout or the job's run deadline passed (``timeout``)."""


#: The exception each class raises.
ERROR_FOR_CLASS: dict[FailureClass, type[KineticJobFailed]] = {
    FailureClass.USER_ERROR: KineticUserError,
    FailureClass.INFRA: KineticInfraError,
    FailureClass.PREEMPTION: KineticPreempted,
    FailureClass.NO_CAPACITY: KineticNoCapacity,
    FailureClass.TIMEOUT: KineticTimeout,
    FailureClass.CANCELLED: KineticJobCancelled,
    FailureClass.STORE: KineticStoreError,
}


def job_failed(
    message: str, failure: Failure | None, job_id: str | None = None
) -> KineticJobFailed:
    """The typed exception for ``failure`` (raise it ``from`` the remote exception);
    a plain ``KineticJobFailed`` when what failed is not known."""
    if failure is None:
        return KineticJobFailed(message, job_id=job_id)
    return ERROR_FOR_CLASS[failure.failure_class](message, job_id=job_id, failure=failure)


class KineticBatchFailed(KineticError, AirflowException):
    """Some inputs of a ``KineticMapOperator`` batch failed.

    ``partial_results`` holds every position in input order: the value of a
    succeeded input, the exception of a failed one; ``failures`` maps failed input
    indices to their exceptions.
    """

    def __init__(
        self,
        message: str,
        *,
        group_id: str,
        failures: dict[int, BaseException],
        partial_results: list[Any],
    ):
        super().__init__(message)
        self.group_id = group_id
        self.failures = failures
        self.partial_results = partial_results
