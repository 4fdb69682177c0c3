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
    # A file:// directory is no page the UI opens: local jobs link to the Kinetic page.
    local = {"backend": "local", "bucket_name": "/r", "job_id": "job-1"}
    assert job_url(local) == "/kinetic/jobs/job-1"
    assert job_url(local, "kn_other") == "/kinetic/jobs/job-1?conn_id=kn_other"


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


def test_connection_form_has_a_documented_field_for_every_extra():
    from airflow_provider_kinetic import get_provider_info
    from airflow_provider_kinetic.deployment.connection import _EXTRA_FIELDS
    from airflow_provider_kinetic.hooks.kinetic import KineticHook

    (conn,) = get_provider_info()["connection-types"]
    fields = conn["conn-fields"]
    assert set(fields) == set(_EXTRA_FIELDS)
    for name, field in fields.items():
        assert field["label"] and len(field["description"]) > 20, name
    assert set(conn["ui-field-behaviour"]["placeholders"]) == set(_EXTRA_FIELDS)
    assert fields["use_internal_ip"]["schema"]["type"] == ["boolean", "null"]
    # The 3.2+ form shows a field's examples where 3.1 shows placeholders: the same text.
    placeholders = conn["ui-field-behaviour"]["placeholders"]
    assert fields["bucket"]["schema"]["examples"] == [placeholders["bucket"]]
    assert KineticHook.get_ui_field_behaviour()["placeholders"]["bucket"].endswith("-jobs")


def test_providers_manager_sees_every_component_and_the_form():
    code = (
        "import json\n"
        "from airflow.providers_manager import ProvidersManager as P\n"
        "p = P()\n"
        "info = p.providers['airflow-provider-kinetic'].data\n"
        "w = p.connection_form_widgets\n"
        "b = p.field_behaviours['kinetic']\n"
        "print('OUT', json.dumps({'ops': info['operators'][0]['python-modules'],\n"
        "  'sensors': info['sensors'][0]['python-modules'],\n"
        "  'triggers': info['triggers'][0]['python-modules'],\n"
        "  'widgets': sorted(k for k in w if k.startswith('extra__kinetic__')),\n"
        "  'backend': w['extra__kinetic__backend'].field['schema'].get('enum'),\n"
        "  'placeholder': b['placeholders'].get('extra__kinetic__bucket')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("OUT "))
    import json

    seen = json.loads(line[4:])
    assert seen["ops"] == [
        "airflow_provider_kinetic.operators.run",
        "airflow_provider_kinetic.operators.map",
    ]
    assert seen["sensors"] == [
        "airflow_provider_kinetic.sensors.job",
        "airflow_provider_kinetic.sensors.batch",
    ]
    assert "airflow_provider_kinetic.triggers.batch" in seen["triggers"]
    assert "extra__kinetic__gcp_conn_id" in seen["widgets"] and len(seen["widgets"]) == 25
    assert seen["backend"] == ["local", "gke", "pathways", "jobset", "auto", None]
    assert seen["placeholder"] == "my-project-kn-my-cluster-jobs"
