"""Errors an Airflow task raises when its kinetic job did not deliver a value.

They are ``AirflowException`` subclasses (so Airflow's retry rules apply as usual)
and ``KineticError`` subclasses (so ``except KineticError`` catches every kinetic
failure, core or Airflow layer).  The remote exception, when there is one, is the
``__cause__`` and its traceback is in the notes.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.errors import KineticError


class KineticJobFailed(KineticError, AirflowException):
    """The job ran and failed (the function raised, or the platform killed it)."""

    def __init__(self, message: str, *, job_id: str | None = None):
        super().__init__(message)
        self.job_id = job_id


class KineticJobCancelled(KineticJobFailed):
    """The job was cancelled: the task's execution_timeout, or the trigger gave up."""


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
