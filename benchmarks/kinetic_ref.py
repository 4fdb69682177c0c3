"""keras-kinetic 0.0.4 itself, the baseline every ratio is measured against.

The wheel is installed (``--no-deps``) for the compatibility tests, but ``import
kinetic`` runs ``kinetic/__init__.py``, which needs cloud SDKs the environment does
not have.  The modules the benchmark needs (``kinetic.data.data``,
``kinetic.utils.storage``) only need absl, cloudpickle and google-cloud-storage, so a
bare package object pointing at the installed directory stands in for ``kinetic``:
its submodules import normally and ``__init__`` is never run.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path


def kinetic_dir() -> Path | None:
    """The installed package directory (found without importing it), or None."""
    spec = importlib.util.find_spec("kinetic")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def load(module: str) -> types.ModuleType:
    """``kinetic.<module>`` from the installed 0.0.4 wheel, without ``kinetic/__init__``."""
    if "kinetic" not in sys.modules:
        where = kinetic_dir()
        if where is None:
            raise ImportError("keras-kinetic 0.0.4 is not installed (pip install --no-deps)")
        package = types.ModuleType("kinetic")
        package.__path__ = [str(where)]
        sys.modules["kinetic"] = package
    return importlib.import_module(f"kinetic.{module}")
