"""The arrows point one way: nothing under ``core/`` or ``runner/`` imports Airflow.

The runner imports these modules in pods that have only ``cloudpickle`` and
``google-cloud-storage``; Airflow-dependent code (credentials from Airflow
connections, operators, triggers) lives in the Airflow layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_provider_kinetic
import airflow_provider_kinetic.core as core
import airflow_provider_kinetic.runner as runner

PACKAGE = Path(airflow_provider_kinetic.__file__).parent
AIRFLOW_FREE = sorted(
    p
    for root in (Path(core.__file__).parent, Path(runner.__file__).parent)
    for p in root.rglob("*.py")
)


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def airflow_imports(path: Path) -> list[str]:
    """Every ``import airflow...`` / ``from airflow... import`` anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "airflow"]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "airflow"
        ):
            found.append(node.module)
    return found


def test_the_walk_sees_the_modules():
    names = {module_name(p) for p in AIRFLOW_FREE}
    assert "airflow_provider_kinetic.core.backends.gke" in names
    assert "airflow_provider_kinetic.runner.remote" in names
    assert len(names) > 25


@pytest.mark.parametrize("path", AIRFLOW_FREE, ids=module_name)
def test_no_airflow_import_in_source(path: Path):
    assert airflow_imports(path) == []


def test_importing_every_core_and_runner_module_loads_no_airflow():
    mods = [module_name(p) for p in AIRFLOW_FREE]
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "assert not bad, bad\n"
        "print(len(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_check_would_catch_an_airflow_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from airflow.sdk import BaseHook\n    import airflow.models\n")
    assert airflow_imports(bad) == ["airflow.sdk", "airflow.models"]


def test_a_missing_optional_package_names_the_extra_to_install():
    """kubernetes hidden: the gke backend's import error names the [gke] extra."""
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "from airflow_provider_kinetic.core.backends.registry import backend_class\n"
        "try:\n    backend_class('gke')\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "airflow-provider-kinetic[gke]" in out.stdout, out.stderr


def test_gke_extra_holds_what_the_gke_path_imports():
    """Each [gke] package is imported on the GKE path (cncf.kubernetes through
    providers-google's GKE hook, which our credentials use)."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0] for d in project["optional-dependencies"]["gke"]}
    assert names == {
        "apache-airflow-providers-google",
        "apache-airflow-providers-cncf-kubernetes",
        "kubernetes",
        "kubernetes_asyncio",
        "tenacity",
        "google-cloud-artifact-registry",
    }
    code = (
        "import sys\n"
        "import airflow_provider_kinetic.core.backends.gke\n"
        "import airflow_provider_kinetic.hooks.gke_auth\n"
        "from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook\n"
        "import kubernetes_asyncio.client\n"
        # bundled images: the tag lookup (hooks/image_build.py) uses it
        "from airflow_provider_kinetic.hooks.image_build import ImageBuildHook\n"
        "import google.cloud.artifactregistry_v1\n"
        "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
        "('kubernetes', 'kubernetes_asyncio', 'tenacity')))\n"
        "print('airflow.providers.cncf.kubernetes' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert set(ast.literal_eval(lines[-2])) == {"kubernetes", "kubernetes_asyncio", "tenacity"}
    assert lines[-1] == "True"
