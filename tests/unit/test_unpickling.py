"""Pickles written before a module moved still load (a deployment upgraded mid-run)."""

from __future__ import annotations

import io
import pickle
import pickletools

import cloudpickle
import pytest

from airflow_provider_kinetic.core.data.hashing.treewalk import DataPathError
from airflow_provider_kinetic.core.jobs import batchwire, unpickling


def old_path_pickle(obj: object, new_module: str, old_module: str) -> bytes:
    """``obj`` pickled as an older version wrote it: its module named by the old path."""
    # Protocol 2 names globals as "module\nname\n" lines (no frame lengths to patch).
    blob = pickle.dumps(obj, protocol=2)
    assert (new_module + "\n").encode() in blob
    old = blob.replace((new_module + "\n").encode(), (old_module + "\n").encode())
    pickletools.dis(old, out=io.StringIO())  # still a well-formed pickle
    return old


def test_a_batch_payload_of_the_old_layout_loads():
    payload = {"func": batchwire.batch_guard, "args": (), "kwargs": {}}
    blob = old_path_pickle(
        payload,
        "airflow_provider_kinetic.core.jobs.batchwire",
        "airflow_provider_kinetic.core.batchwire",
    )
    with pytest.raises(ModuleNotFoundError):
        cloudpickle.loads(blob)  # what the runner did before
    assert unpickling.loads(blob)["func"] is batchwire.batch_guard


def test_an_exception_of_the_old_layout_loads():
    blob = old_path_pickle(
        DataPathError("bad"),
        "airflow_provider_kinetic.core.data.hashing.errors",
        "airflow_provider_kinetic.core.treewalk",
    )
    err = unpickling.loads(blob)
    assert type(err) is DataPathError and str(err) == "bad"


def test_a_module_that_is_now_a_package_resolves_its_old_names():
    from airflow_provider_kinetic.core.batch import plan

    blob = old_path_pickle(
        plan.split_input,
        "airflow_provider_kinetic.core.batch.plan",
        "airflow_provider_kinetic.core.batch",
    )
    assert unpickling.loads(blob) is plan.split_input


def test_unknown_names_still_fail():
    blob = pickle.dumps(batchwire.batch_guard, protocol=2).replace(b"batch_guard", b"batch_gone_")
    with pytest.raises(AttributeError):
        unpickling.loads(blob)


def test_every_moved_module_exists():
    import importlib

    for new in unpickling.MOVED_MODULES.values():
        importlib.import_module(new)
