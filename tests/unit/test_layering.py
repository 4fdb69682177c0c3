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


def test_extras_hold_only_what_is_imported_and_a_missing_one_is_named(tmp_path):
    """No module imports cncf.kubernetes, so the [gke] extra does not pull it; a missing
    optional package fails with the extra to install."""
    import tomllib

    extras = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    gke = " ".join(extras["optional-dependencies"]["gke"])
    assert "cncf-kubernetes" not in gke
    for path in PACKAGE.rglob("*.py"):
        assert "airflow.providers.cncf" not in path.read_text(), path
    # kubernetes hidden: the gke backend's import error names the extra.
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "from airflow_provider_kinetic.core.backends.registry import backend_class\n"
        "try:\n    backend_class('gke')\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "airflow-provider-kinetic[gke]" in out.stdout, out.stderr
