"""airflow-provider-kinetic: run Python callables on GKE TPU/GPU pods from Airflow.

Importing this package must not import Airflow: the runner imports it inside pods
that only have ``cloudpickle`` and ``google-cloud-storage``.  Public names are
re-exported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_kinetic.core.version import __version__

if TYPE_CHECKING:  # what editors and type checkers see; runtime imports stay lazy
    from airflow_provider_kinetic.attached import AttachedJob, attach
    from airflow_provider_kinetic.core.batch.state import BatchState
    from airflow_provider_kinetic.core.data import Data
    from airflow_provider_kinetic.core.errors import KineticError
    from airflow_provider_kinetic.core.jobs.resultref import load_result
    from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
    from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
    from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
    from airflow_provider_kinetic.decorators.kinetic import kinetic_task
    from airflow_provider_kinetic.exceptions import (
        KineticBatchFailed,
        KineticInfraError,
        KineticJobCancelled,
        KineticJobFailed,
        KineticNoCapacity,
        KineticPreempted,
        KineticStoreError,
        KineticTimeout,
        KineticUserError,
    )
    from airflow_provider_kinetic.hooks.kinetic import KineticHook
    from airflow_provider_kinetic.keys import store
    from airflow_provider_kinetic.operators.assets import task_asset
    from airflow_provider_kinetic.operators.map import KineticMapOperator
    from airflow_provider_kinetic.operators.run import KineticRunOperator
    from airflow_provider_kinetic.sensors.batch import KineticBatchSensor
    from airflow_provider_kinetic.sensors.job import KineticJobSensor
    from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
    from airflow_provider_kinetic.triggers.job import KineticJobTrigger

#: Public name -> the module that defines it (imported on first attribute access).
_LAZY = {
    "AttachedJob": "airflow_provider_kinetic.attached",
    "attach": "airflow_provider_kinetic.attached",
    "BatchState": "airflow_provider_kinetic.core.batch.state",
    "BroadcastWindow": "airflow_provider_kinetic.core.keys.peer.window",
    "Data": "airflow_provider_kinetic.core.data",
    "JobHandle": "airflow_provider_kinetic.core.spec.handles",
    "JobStatus": "airflow_provider_kinetic.core.spec.handles",
    "KineticError": "airflow_provider_kinetic.core.errors",
    "KineticBatchFailed": "airflow_provider_kinetic.exceptions",
    "KineticJobCancelled": "airflow_provider_kinetic.exceptions",
    "KineticJobFailed": "airflow_provider_kinetic.exceptions",
    "KineticInfraError": "airflow_provider_kinetic.exceptions",
    "KineticNoCapacity": "airflow_provider_kinetic.exceptions",
    "KineticPreempted": "airflow_provider_kinetic.exceptions",
    "KineticStoreError": "airflow_provider_kinetic.exceptions",
    "KineticTimeout": "airflow_provider_kinetic.exceptions",
    "KineticUserError": "airflow_provider_kinetic.exceptions",
    "Failure": "airflow_provider_kinetic.core.spec.failure",
    "FailureClass": "airflow_provider_kinetic.core.spec.failure",
    "KineticHook": "airflow_provider_kinetic.hooks.kinetic",
    "KineticMapOperator": "airflow_provider_kinetic.operators.map",
    "KineticRunOperator": "airflow_provider_kinetic.operators.run",
    "KineticJobSensor": "airflow_provider_kinetic.sensors.job",
    "KineticBatchSensor": "airflow_provider_kinetic.sensors.batch",
    "KineticBatchTrigger": "airflow_provider_kinetic.triggers.batch",
    "KineticJobTrigger": "airflow_provider_kinetic.triggers.job",
    "kinetic_task": "airflow_provider_kinetic.decorators.kinetic",
    "load_result": "airflow_provider_kinetic.core.jobs.resultref",
    "store": "airflow_provider_kinetic.keys",
    "task_asset": "airflow_provider_kinetic.operators.assets",
}

# A literal list so tools read it statically; a test keeps it equal to _LAZY.
__all__ = [
    "AttachedJob",
    "BatchState",
    "BroadcastWindow",
    "Data",
    "Failure",
    "FailureClass",
    "JobHandle",
    "JobStatus",
    "KineticBatchFailed",
    "KineticBatchSensor",
    "KineticBatchTrigger",
    "KineticError",
    "KineticHook",
    "KineticInfraError",
    "KineticJobCancelled",
    "KineticJobFailed",
    "KineticJobSensor",
    "KineticJobTrigger",
    "KineticMapOperator",
    "KineticNoCapacity",
    "KineticPreempted",
    "KineticRunOperator",
    "KineticStoreError",
    "KineticTimeout",
    "KineticUserError",
    "__version__",
    "attach",
    "get_provider_info",
    "kinetic_task",
    "load_result",
    "store",
    "task_asset",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'airflow_provider_kinetic' has no attribute {name!r}")


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow's providers manager (entry point)."""
    from airflow_provider_kinetic.provider_info import provider_info

    return provider_info(__version__)
