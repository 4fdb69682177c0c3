"""airflow-provider-kinetic: run Python callables on GKE TPU/GPU pods from Airflow.

Importing this package must not import Airflow: the runner imports it inside pods
that only have ``cloudpickle`` and ``google-cloud-storage``.  Public names are
re-exported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # what editors and type checkers see; runtime imports stay lazy
    from airflow_provider_kinetic.attached import AttachedJob, attach
    from airflow_provider_kinetic.core.batchstate import BatchState
    from airflow_provider_kinetic.core.data import Data
    from airflow_provider_kinetic.core.errors import KineticError
    from airflow_provider_kinetic.core.handles import JobHandle, JobStatus
    from airflow_provider_kinetic.core.resultref import load_result
    from airflow_provider_kinetic.decorators.kinetic import kinetic_task
    from airflow_provider_kinetic.exceptions import (
        KineticBatchFailed,
        KineticJobCancelled,
        KineticJobFailed,
    )
    from airflow_provider_kinetic.hooks.kinetic import KineticHook
    from airflow_provider_kinetic.operators.map import KineticMapOperator
    from airflow_provider_kinetic.operators.run import KineticRunOperator
    from airflow_provider_kinetic.sensors.job import KineticJobSensor
    from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger
    from airflow_provider_kinetic.triggers.job import KineticJobTrigger

#: Public name -> the module that defines it (imported on first attribute access).
_LAZY = {
    "AttachedJob": "airflow_provider_kinetic.attached",
    "attach": "airflow_provider_kinetic.attached",
    "BatchState": "airflow_provider_kinetic.core.batchstate",
    "Data": "airflow_provider_kinetic.core.data",
    "JobHandle": "airflow_provider_kinetic.core.handles",
    "JobStatus": "airflow_provider_kinetic.core.handles",
    "KineticError": "airflow_provider_kinetic.core.errors",
    "KineticBatchFailed": "airflow_provider_kinetic.exceptions",
    "KineticJobCancelled": "airflow_provider_kinetic.exceptions",
    "KineticJobFailed": "airflow_provider_kinetic.exceptions",
    "KineticHook": "airflow_provider_kinetic.hooks.kinetic",
    "KineticMapOperator": "airflow_provider_kinetic.operators.map",
    "KineticRunOperator": "airflow_provider_kinetic.operators.run",
    "KineticJobSensor": "airflow_provider_kinetic.sensors.job",
    "KineticBatchTrigger": "airflow_provider_kinetic.triggers.batch",
    "KineticJobTrigger": "airflow_provider_kinetic.triggers.job",
    "kinetic_task": "airflow_provider_kinetic.decorators.kinetic",
    "load_result": "airflow_provider_kinetic.core.resultref",
}

# A literal list so tools read it statically; a test keeps it equal to _LAZY.
__all__ = [
    "AttachedJob",
    "BatchState",
    "Data",
    "JobHandle",
    "JobStatus",
    "KineticBatchFailed",
    "KineticBatchTrigger",
    "KineticError",
    "KineticHook",
    "KineticJobCancelled",
    "KineticJobFailed",
    "KineticJobSensor",
    "KineticJobTrigger",
    "KineticMapOperator",
    "KineticRunOperator",
    "__version__",
    "attach",
    "get_provider_info",
    "kinetic_task",
    "load_result",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'airflow_provider_kinetic' has no attribute {name!r}")


def _option(description: str, kind: str, default: str, sensitive: bool = False) -> dict:
    return {
        "description": description,
        "version_added": "0.1.0",
        "type": kind,
        "example": None,
        "default": default,
        "sensitive": sensitive,
    }


#: ``[kinetic]`` options (``airflow config list`` shows them with their defaults).
_CONFIG = {
    "allow_local_fallback": _option(
        "Without a kinetic_default connection, run jobs on this machine with the embedded "
        "local backend (with a WARNING). Set False in production to make that an error.",
        "boolean",
        "True",
    ),
    "max_xcom_result_bytes": _option(
        "Results larger than this (or not serialisable by Airflow) stay in the store and "
        "XCom carries a reference (load_result).",
        "integer",
        "1048576",
    ),
    "result_signing_key": _option(
        "Deployment secret that per-job result keys derive from; default: [core] fernet_key, "
        "else a key file under $AIRFLOW_HOME/kinetic.",
        "string",
        "",
        sensitive=True,
    ),
    "k8s_api_attempts": _option("Tries per Kubernetes API call (429/5xx/resets).", "integer", "5"),
    "k8s_api_retry_wait_min": _option("First backoff, seconds.", "float", "0.5"),
    "k8s_api_retry_wait_max": _option("Longest backoff, seconds.", "float", "15"),
    "k8s_api_retry_after_max": _option("Cap on a Retry-After header, seconds.", "float", "30"),
}


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow's providers manager (entry point)."""
    from airflow_provider_kinetic.core.backends.registry import backend_kinds

    return {
        "package-name": "airflow-provider-kinetic",
        "name": "Kinetic",
        "description": "Run Python callables on GKE TPU/GPU pods (keras-team/kinetic protocol).",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Kinetic",
                "external-doc-url": "https://github.com/keras-team/kinetic",
                "tags": ["service"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Kinetic",
                "python-modules": ["airflow_provider_kinetic.hooks.kinetic"],
            }
        ],
        "operators": [
            {
                "integration-name": "Kinetic",
                "python-modules": ["airflow_provider_kinetic.operators.run"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Kinetic",
                "python-modules": ["airflow_provider_kinetic.triggers.job"],
            }
        ],
        "extra-links": ["airflow_provider_kinetic.links.KineticJobLink"],
        "config": {"kinetic": {"description": "airflow-provider-kinetic", "options": _CONFIG}},
        "task-decorators": [
            {
                "name": "kinetic",
                "class-name": "airflow_provider_kinetic.decorators.kinetic.kinetic_task",
            }
        ],
        "connection-types": [
            {
                "connection-type": "kinetic",
                "hook-class-name": "airflow_provider_kinetic.hooks.kinetic.KineticHook",
                "hook-name": "Kinetic",
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "login", "password", "schema"],
                    "relabeling": {},
                },
                "conn-fields": {
                    "backend": {
                        "label": "Backend",
                        "schema": {"type": ["string", "null"], "enum": [*backend_kinds(), None]},
                    },
                    **{
                        name: {"label": label, "schema": {"type": ["string", "null"]}}
                        for name, label in (
                            ("bucket", "Jobs bucket"),
                            ("root", "Local store root"),
                            ("project", "GCP project"),
                            ("zone", "Zone"),
                            ("cluster", "GKE cluster"),
                            ("namespace", "Namespace"),
                            ("image", "Container image"),
                            ("service_account", "Kubernetes service account"),
                        )
                    },
                },
            }
        ],
    }
