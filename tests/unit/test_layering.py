"""The arrows point one way: what the import-linter contracts cannot say.

The layers themselves (Airflow layer above triggers/hooks above core; inside core,
batch above jobs above backends and data; no Airflow in core or the runner; the
runner importing only what a pod has) are contracts in ``pyproject.toml``, checked by
``lint-imports`` in the test command.  Here: that they would catch a violation, that
no module anywhere imports in a circle (package ``__init__`` modules included), that
importing core and the runner loads no Airflow at run time (registries import by
path, which no static check sees), the module size guideline, and the optional
dependencies of the GKE path.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

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


def import_cycles(package: str) -> list[list[str]]:
    """Every set of modules of ``package`` that import each other in a circle (module
    level, package ``__init__`` modules included; imports inside functions and under
    TYPE_CHECKING count, as grimp reads them)."""
    graph = grimp.build_graph(package, cache_dir=None)
    mods = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {m: sorted(set(graph.find_modules_directly_imported_by(m)) & set(mods)) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges[v]:
                cycles.append(sorted(comp))

    for m in mods:
        if m not in index:
            visit(m)
    return cycles


def test_no_import_cycles_anywhere_in_the_package():
    """The acyclic_siblings contract sees cycles between siblings; this also sees a
    package's ``__init__`` and its own modules importing each other."""
    assert import_cycles("airflow_provider_kinetic") == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyclepkg import c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cyclepkg.a\n"
    )
    (pkg / "d.py").write_text("import cyclepkg.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b", "cyclepkg.c"]]


def test_the_contracts_catch_an_upward_import(tmp_path):
    """``lint-imports`` (the test command runs it) fails when core imports the Airflow
    layer, even inside a function: checked on a copy of the package with one such import."""
    copy = tmp_path / "airflow_provider_kinetic"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    errors = copy / "core" / "errors.py"
    errors.write_text(
        errors.read_text() + "\n\ndef _late():\n"
        "    from airflow_provider_kinetic.operators import run  # noqa: F401\n"
    )
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [str(lint), "--no-cache", str(PACKAGE.parent / "pyproject.toml")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "airflow_provider_kinetic.core.errors -> airflow_provider_kinetic.operators.run" in text
    assert "BROKEN" in text


#: The module size guideline (docs/ARCHITECTURE.md): split by responsibility beyond it.
MAX_LINES = 400


def test_every_module_stays_under_the_size_guideline():
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 90
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def test_every_subpackage_says_what_lives_there():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 12, f"{init} needs a docstring saying what it holds"


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
        "import airflow_provider_kinetic.core.backends.k8s.gke\n"
        "import airflow_provider_kinetic.gcp.gke_auth\n"
        "from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook\n"
        "import kubernetes_asyncio.client\n"
        # bundled images: the tag lookup (gcp/image_build.py) uses it
        "from airflow_provider_kinetic.gcp.image_build import ImageBuildHook\n"
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
