"""Callables that are not plain functions run remotely: ``functools.partial``, bound
methods (of an instance and of a class) and callable objects, as real jobs of the
local backend's runner in its own process.

Their code lives in a module of a by-value root that the runner cannot import (as a
DAG file's helpers are not on a pod), so each job proves the user's module travelled
by value in the payload, and the results prove the bound arguments travelled too.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus

HELPERS = textwrap.dedent(
    """
    import sys

    SCALE = 10

    def scaled(a, b, *, c=0):
        return {"value": a * SCALE + b + c, "imported": __name__ in sys.modules}

    class Counter:
        def __init__(self, base):
            self.base = base

        def add(self, x, y=0):
            return {"value": self.base + x + y, "imported": __name__ in sys.modules}

        def __call__(self, x):
            return {"value": self.base * x, "imported": __name__ in sys.modules}

        @classmethod
        def make(cls, x):
            return {"value": f"{cls.__name__}:{x}", "imported": __name__ in sys.modules}
    """
)


@pytest.fixture
def helpers(tmp_path: Path) -> Iterator[tuple[ModuleType, str]]:
    """A helper module under a by-value root (a DAGs folder), imported here only."""
    root = tmp_path / "dags"
    root.mkdir()
    name = f"kinetic_callable_helpers_{uuid.uuid4().hex[:8]}"
    path = root / f"{name}.py"
    path.write_text(HELPERS)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    try:
        yield module, str(root)
    finally:
        sys.modules.pop(name, None)


def cases(m: ModuleType) -> dict[str, tuple[Any, tuple, dict, Any, str]]:
    """name -> (callable, args, kwargs, the value it must return, its func_name)."""
    counter = m.Counter(5)
    return {
        "partial": (functools.partial(m.scaled, 1, c=3), (2,), {}, 15, "scaled"),
        "bound method": (counter.add, (1,), {"y": 2}, 8, "add"),
        "callable object": (m.Counter(7), (3,), {}, 21, "Counter"),
        "partial of a bound method": (functools.partial(counter.add, 10), (1,), {}, 16, "add"),
        "classmethod": (m.Counter.make, (4,), {}, "Counter:4", "make"),
        "nested partial": (
            functools.partial(functools.partial(m.scaled, c=100), 2),
            (),
            {"b": 1},
            121,
            "scaled",
        ),
    }


def test_partials_methods_and_callable_objects_run_remotely_with_their_arguments(
    config, backend, helpers
) -> None:
    module, root = helpers
    submitted = {}
    for name, (func, args, kwargs, _, func_name) in cases(module).items():
        request = JobRequest(func=func, args=args, kwargs=kwargs, by_value_roots=[root])
        assert request.func_name == func_name, name
        submitted[name] = submit_job(request, config, backend)[0]
    for name, (_, _, _, expected, _) in cases(module).items():
        handle = submitted[name]
        backend.wait([handle], 60)
        report = backend.status(handle)
        assert report.status is JobStatus.SUCCEEDED, f"{name}: {backend.read_logs(handle)[0]}"
        value = collect(config.store(), handle.job_id, report.status)
        # The value proves the bound arguments arrived; "imported" False proves the
        # helper module was not importable there: its code travelled by value.
        assert value == {"value": expected, "imported": False}, name
