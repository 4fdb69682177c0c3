"""Failure payloads whose exception cannot be rebuilt on the client still raise what
the remote function raised: its type name, message and traceback, as a
``RemoteFunctionError`` (payloads of this package's runner and of kinetic 0.0.4's)."""

from __future__ import annotations

import pickle
import sys
import threading
import types
from pathlib import Path

import cloudpickle
import pytest

from airflow_provider_kinetic.core.jobs.payload import RemoteFunctionError, dump_result, make_result
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.storage import LocalStore

JOB = "job-0000e001"
TB = 'Traceback (most recent call last):\n  File "f.py", line 1, in g\nTwoArgError: E1: x\n'


class TwoArgError(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")


def _store(tmp_path: Path, payload: dict, dumps=cloudpickle.dumps) -> LocalStore:
    store = LocalStore(str(tmp_path))
    store.write_bytes(f"{JOB}/result.pkl", dumps(payload))
    return store


def _collect_error(store: LocalStore) -> BaseException:
    with pytest.raises(BaseException) as info:
        collect(store, JOB, JobStatus.FAILED, "exit code 1")
    return info.value


def test_our_runners_payload_raises_the_recorded_type_message_and_traceback(tmp_path):
    payload = make_result(success=False, exception=TwoArgError("E1", "x"), traceback=TB)
    err = _collect_error(_store(tmp_path, payload))
    assert isinstance(err, RemoteFunctionError)
    assert err.remote_type == f"{__name__}.TwoArgError"
    assert (err.remote_message, err.remote_traceback) == ("E1: x", TB)
    assert str(err) == f"{__name__}.TwoArgError: E1: x"
    notes = "\n".join(err.__notes__)
    assert "could not be rebuilt here: TypeError" in notes and "missing 1 required" in notes
    assert "Failed during kinetic phase: execute" in notes
    assert "Remote traceback:\n" + TB in err.__notes__
    # A success whose value cannot be rebuilt is no failure: still an error about the payload.
    store = _store(tmp_path, make_result(success=True, result=TwoArgError("E1", "x")))
    with pytest.raises(RemoteFunctionError, match="could not be deserialised here: TypeError"):
        collect(store, JOB, JobStatus.SUCCEEDED)


def test_kinetic_runners_payload_names_the_class_and_message_from_the_pickle(tmp_path):
    """kinetic 0.0.4's runner records no strings: the pickle's class and args say it."""
    payload = {
        "success": False,
        "result": None,
        "exception": TwoArgError("E1", "x"),
        "traceback": TB,
    }
    err = _collect_error(_store(tmp_path, payload))
    assert isinstance(err, RemoteFunctionError)
    assert str(err) == f"{__name__}.TwoArgError: E1: x"
    assert "Remote traceback:\n" + TB in err.__notes__


def test_class_not_importable_here(tmp_path, monkeypatch):
    """A class of a module the job had (its image, its requirements) but this
    machine lacks."""
    mod = types.ModuleType("kinetic_only_in_the_image")
    exec("class ImageOnlyError(Exception):\n    pass\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    exc = mod.ImageOnlyError("cuda said no")
    store = _store(tmp_path, make_result(success=False, exception=exc, traceback=TB), pickle.dumps)
    monkeypatch.delitem(sys.modules, mod.__name__)
    err = _collect_error(store)
    assert isinstance(err, RemoteFunctionError)
    assert str(err) == "kinetic_only_in_the_image.ImageOnlyError: cuda said no"
    assert "ModuleNotFoundError" in "\n".join(err.__notes__)


def test_kinetic_payload_with_a_class_not_importable_here(tmp_path, monkeypatch):
    mod = types.ModuleType("kinetic_only_in_the_image")
    exec("class ImageOnlyError(Exception):\n    pass\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    payload = {"success": False, "result": None, "exception": mod.ImageOnlyError("a", 2)}
    store = _store(tmp_path, payload, pickle.dumps)
    monkeypatch.delitem(sys.modules, mod.__name__)
    err = _collect_error(store)
    assert str(err) == "kinetic_only_in_the_image.ImageOnlyError: ('a', 2)"


def test_an_exception_that_unpickles_arrives_as_itself(tmp_path):
    payload = make_result(success=False, exception=KeyError("k"), traceback=TB)
    assert payload["exception_type"] == "builtins.KeyError"
    err = _collect_error(_store(tmp_path, payload))
    assert type(err) is KeyError and "Remote traceback:\n" + TB in err.__notes__


class DefaultedError(Exception):
    """Rebuilds from its pickle, but as ``DefaultedError("E1: x", "unknown")``."""

    def __init__(self, code: str, detail: str = "unknown"):
        super().__init__(f"{code}: {detail}")


def test_an_exception_rebuilt_with_another_message_says_what_was_raised(tmp_path):
    payload = make_result(success=False, exception=DefaultedError("E1", "x"), traceback=TB)
    err = _collect_error(_store(tmp_path, payload))
    assert type(err) is DefaultedError and str(err) == "E1: x: unknown"
    assert f"Remote error: {__name__}.DefaultedError: E1: x" in err.__notes__
    # An exception the runner could not pickle arrives as kinetic's RuntimeError, naming it.
    held = HoldsALock("locked 5")
    blob, ok = dump_result(make_result(success=False, exception=held, traceback=TB))
    assert not ok
    store = LocalStore(str(tmp_path / "held"))
    store.write_bytes(f"{JOB}/result.pkl", blob)
    err = _collect_error(store)
    assert type(err) is RuntimeError and "Result serialization failed" in str(err)
    assert f"Remote error: {__name__}.HoldsALock: locked 5" in err.__notes__


class HoldsALock(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()


def test_a_broken_str_does_not_lose_the_failure():
    class BadStr(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    payload = make_result(success=False, exception=BadStr(), traceback=TB)
    assert payload["exception_message"] == "<str() failed: RuntimeError: no str for you>"
    assert payload["exception_type"].endswith("BadStr")
    lock_payload = make_result(success=False, exception=ValueError(threading.Lock()))
    assert "lock" in lock_payload["exception_message"]
