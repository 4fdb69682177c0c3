"""The provider as Airflow discovers it: entry point, schema, connection type, decorator."""

from __future__ import annotations

import subprocess
import sys

from airflow_provider_kinetic.links import job_url


def test_providers_manager_loads_kinetic():
    code = (
        "from airflow.providers_manager import ProvidersManager as P\n"
        "p = P()\n"
        "info = p.providers['airflow-provider-kinetic']\n"
        "print('V', info.version)\n"
        "print('H', p.hooks['kinetic'].hook_class_name)\n"
        "from airflow.sdk import task\n"
        "print('D', task.kinetic.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = dict(
        line.split(" ", 1) for line in out.stdout.splitlines() if line[:2] in ("V ", "H ", "D ")
    )
    version, hook, decorator = found["V"], found["H"], found["D"]
    assert version == "0.1.0"
    assert hook == "airflow_provider_kinetic.hooks.kinetic.KineticHook"
    assert decorator == "airflow_provider_kinetic.decorators.kinetic"


def test_importing_the_package_does_not_import_airflow():
    code = (
        "import sys, airflow_provider_kinetic as k\n"
        "k.get_provider_info()\n"
        "print('airflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_job_links():
    gke = {
        "job_id": "job-1",
        "bucket_name": "b",
        "backend": "gke",
        "zone": "us-central1-a",
        "cluster_name": "c1",
        "namespace": "ns",
        "k8s_name": "kinetic-job-1",
        "project": "p",
    }
    assert job_url(gke) == (
        "https://console.cloud.google.com/kubernetes/job/us-central1-a/c1/ns/"
        "kinetic-job-1/details?project=p"
    )
    assert "/leaderworkerset/" in job_url({**gke, "backend": "pathways"})
    assert (
        job_url({"backend": "local", "bucket_name": "/r", "job_id": "job-1"}) == "file:///r/job-1/"
    )


def test_public_api_is_listed_and_resolves():
    import airflow_provider_kinetic as pkg

    assert set(pkg.__all__) == set(pkg._LAZY) | {"__version__", "get_provider_info"}
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, name
    assert pkg.KineticMapOperator.__module__ == "airflow_provider_kinetic.operators.map"


def test_kinetic_config_options_are_declared_with_defaults():
    airflow = [sys.executable, "-m", "airflow", "config", "get-value", "kinetic"]
    for option, default in (("max_xcom_result_bytes", "1048576"), ("allow_local_fallback", "True")):
        out = subprocess.run([*airflow, option], capture_output=True, text=True, check=True)
        assert out.stdout.strip().splitlines()[-1] == default, out.stderr
