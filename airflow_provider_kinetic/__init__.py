"""airflow-provider-kinetic: run Python callables on GKE TPU/GPU pods from Airflow.

Importing this package must not import Airflow: the runner imports it inside pods
that only have ``cloudpickle`` and ``google-cloud-storage``.  Public names are
re-exported lazily.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Data": "airflow_provider_kinetic.core.data",
    "JobStatus": "airflow_provider_kinetic.core.handles",
    "KineticHook": "airflow_provider_kinetic.hooks.kinetic",
    "KineticRunOperator": "airflow_provider_kinetic.operators.run",
    "KineticJobTrigger": "airflow_provider_kinetic.triggers.job",
    "kinetic_task": "airflow_provider_kinetic.decorators.kinetic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'airflow_provider_kinetic' has no attribute {name!r}")


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow's providers manager (entry point)."""
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
                    name: {"label": label, "schema": {"type": ["string", "null"]}}
                    for name, label in (
                        ("backend", "Backend (local, gke, pathways, auto)"),
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
            }
        ],
    }
