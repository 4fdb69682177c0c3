"""Payload packing in kinetic's wire shapes: Data discovery/replacement, the payload
dict, naming an unpicklable argument, the result fallback and env capture rules."""

from __future__ import annotations

import collections
import functools
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import NamedTuple

import cloudpickle
import pytest

from airflow_provider_kinetic.core.data import Data, make_data_ref
from airflow_provider_kinetic.core.jobs.byvalue import by_value, underlying
from airflow_provider_kinetic.core.jobs.payload import (
    UnpicklableArgumentError,
    dump_result,
    find_data,
    make_result,
    pack_payload,
    raise_remote_failure,
    replace_data,
)
from airflow_provider_kinetic.core.jobs.request import ENV_BLOCKLIST, capture_env


class Pair(NamedTuple):
    left: object
    right: object


def ref(name: str) -> dict:
    return make_data_ref(f"file:///cache/{name}", True)


# ---- discovery -------------------------------------------------------------------


def test_find_data_at_any_depth(tmp_path: Path) -> None:
    a, b, c, e = (Data(str(tmp_path / n)) for n in "abce")
    dd = collections.defaultdict(list, {"deep": [Pair(1, {"x": c})]})
    args = (a, [1, (2, {"k": b})], dd, Pair(e, None))
    found = list(find_data(args, "op_args"))
    assert [(d, w) for d, w in found] == [
        (a, "op_args[0]"),
        (b, "op_args[1][1][1]['k']"),
        (c, "op_args[2]['deep'][0][1]['x']"),
        (e, "op_args[3][0]"),
    ]
    assert all(found[i][0] is x for i, x in enumerate((a, b, c, e)))


def test_find_data_ignores_plain_values() -> None:
    assert list(find_data({"a": [1, "s", (None, 2.0)], "b": {3, 4}}, "op_kwargs")) == []


@pytest.mark.parametrize(
    "build, where",
    [
        (lambda d: {"s": {d}}, "op_kwargs['s']"),
        (lambda d: {"s": frozenset({d, 1})}, "op_kwargs['s']"),
        (lambda d: {"outer": [{d}]}, "op_kwargs['outer'][0]"),
    ],
)
def test_data_in_a_set_raises_naming_location(tmp_path: Path, build, where) -> None:
    with pytest.raises(TypeError, match=r"set.*" + re.escape(where)):
        list(find_data(build(Data(str(tmp_path))), "op_kwargs"))


def test_data_nested_inside_a_set_element_raises(tmp_path: Path) -> None:
    d = Data(str(tmp_path))
    with pytest.raises(TypeError, match=r"set.*op_args\[0\]"):
        list(find_data(({(1, d)},), "op_args"))


def test_data_as_dict_key_raises_naming_location(tmp_path: Path) -> None:
    d = Data(str(tmp_path))
    with pytest.raises(TypeError, match=r"dict key.*op_kwargs\['cfg'\]"):
        list(find_data({"cfg": {d: 1}}, "op_kwargs"))
    with pytest.raises(TypeError, match=r"dict key.*op_kwargs\['cfg'\]"):
        list(find_data({"cfg": {("k", d): 1}}, "op_kwargs"))


# ---- replacement ---------------------------------------------------------------------


def test_replace_keeps_unchanged_containers_identity(tmp_path: Path) -> None:
    d = Data(str(tmp_path))
    untouched_list, untouched_dict = [1, 2, [3]], {"a": (1, 2)}
    args = ([d, untouched_list], untouched_dict)
    out = replace_data(args, {id(d): ref("h")})
    assert out is not args and out[0] is not args[0]
    assert out[0][0] == ref("h")
    assert out[0][1] is untouched_list
    assert out[1] is untouched_dict
    # Nothing to replace: the very same object comes back.
    plain = ([1], {"x": (2,)})
    assert replace_data(plain, {}) is plain


def test_replace_rebuilds_subclasses(tmp_path: Path) -> None:
    d = Data(str(tmp_path))
    refs = {id(d): ref("h")}
    dd = collections.defaultdict(list, {"k": d})
    od = collections.OrderedDict([("z", 1), ("a", d)])
    out_dd, out_od, out_nt = replace_data((dd, od, Pair(d, 5)), refs)
    assert type(out_dd) is collections.defaultdict and out_dd.default_factory is list
    assert out_dd["k"] == ref("h") and dd["k"] is d  # input not mutated
    assert type(out_od) is collections.OrderedDict and list(out_od) == ["z", "a"]
    assert isinstance(out_nt, Pair) and out_nt == Pair(ref("h"), 5)


def test_same_data_object_twice_gets_one_ref(tmp_path: Path) -> None:
    d = Data(str(tmp_path))
    out = replace_data({"a": d, "b": [d]}, {id(d): ref("h")})
    assert out["a"] is out["b"][0]


# ---- payload -------------------------------------------------------------------------


def add(a, b=0):
    return a + b


def test_payload_keys_are_kinetics() -> None:
    blob = pack_payload(add, (1,), {"b": 2}, env_vars={"X": "1"}, has_data_refs=False)
    payload = cloudpickle.loads(blob)
    assert set(payload) == {
        "func",
        "args",
        "kwargs",
        "env_vars",
        "has_data_refs",
        "client_fingerprint",
    }
    assert payload["func"](*payload["args"], **payload["kwargs"]) == 3
    assert payload["args"] == (1,) and payload["kwargs"] == {"b": 2}
    assert payload["env_vars"] == {"X": "1"} and payload["has_data_refs"] is False
    fp = payload["client_fingerprint"]
    assert set(fp) == {"python", "cloudpickle", "kinetic"}
    assert fp["cloudpickle"] == cloudpickle.__version__
    assert fp["python"].count(".") == 2
    vols = [make_data_ref("file:///c/h", True, "/mnt/v")]
    with_vols = cloudpickle.loads(
        pack_payload(add, (), {}, env_vars={}, volumes=vols, has_data_refs=True)
    )
    assert with_vols["volumes"] == vols and with_vols["has_data_refs"] is True


@pytest.mark.parametrize(
    "args, kwargs, culprit",
    [
        ((), {"ok": 1, "lock": threading.Lock()}, "op_kwargs['lock']"),
        ((1, threading.Lock()), {}, "op_args[1]"),
    ],
)
def test_unpicklable_argument_is_named(args, kwargs, culprit) -> None:
    with pytest.raises(UnpicklableArgumentError) as info:
        pack_payload(add, args, kwargs, env_vars={}, has_data_refs=False)
    msg = str(info.value)
    assert culprit in msg and "lock" in msg.lower()
    assert isinstance(info.value, ValueError)


def test_unpicklable_callable_is_named() -> None:
    lock = threading.Lock()

    def uses_lock():
        return lock

    with pytest.raises(UnpicklableArgumentError, match="the callable"):
        pack_payload(uses_lock, (), {}, env_vars={}, has_data_refs=False)


def test_code_under_by_value_roots_travels_in_the_payload(tmp_path: Path) -> None:
    """A DAG-folder helper module must not be needed on the pod."""
    pkg = tmp_path / "dags"
    pkg.mkdir()
    (pkg / "my_helpers_xyz.py").write_text("def triple(x):\n    return 3 * x\n")
    sys.path.insert(0, str(pkg))
    try:
        import my_helpers_xyz  # type: ignore[import-not-found]

        blob = pack_payload(
            my_helpers_xyz.triple,
            (7,),
            {},
            env_vars={},
            has_data_refs=False,
            by_value_roots=[str(pkg)],
        )
    finally:
        sys.path.remove(str(pkg))
        sys.modules.pop("my_helpers_xyz", None)
    (tmp_path / "p.pkl").write_bytes(blob)
    code = textwrap.dedent(
        """
        import sys, cloudpickle
        p = cloudpickle.loads(open(sys.argv[1], "rb").read())
        print(p["func"](*p["args"]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "p.pkl")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "21"
    # And the registration is undone afterwards.
    assert "my_helpers_xyz" not in cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES


def test_modules_under_roots_resolve_symlinks_as_realpath_does(tmp_path: Path) -> None:
    """A module is under a by-value root when its real file is: reached through a
    symlinked directory or as a symlinked file into the root, never a file outside
    (directories are resolved once per call, a symlinked file in full)."""
    real = tmp_path / "real_dags"
    real.mkdir()
    (real / "mod_in_root_q1.py").write_text("X = 1\n")
    (tmp_path / "linked_dags").symlink_to(real, target_is_directory=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "mod_outside_q1.py").write_text("X = 2\n")
    (outside / "mod_link_q1.py").symlink_to(real / "mod_in_root_q1.py")
    paths = [str(tmp_path / "linked_dags"), str(outside)]
    sys.path[:0] = paths
    names = ("mod_in_root_q1", "mod_outside_q1", "mod_link_q1")
    try:
        mods = [__import__(name) for name in names]
        from airflow_provider_kinetic.core.jobs.byvalue import _modules_under

        found = _modules_under([str(real)])
        assert [m for m in mods if m in found] == [mods[0], mods[2]]
        assert _modules_under([str(tmp_path / "linked_dags")]) == found  # the root's link too
        assert _modules_under([]) == []
    finally:
        for path in paths:
            sys.path.remove(path)
        for name in names:
            sys.modules.pop(name, None)


class Scaler:
    def __init__(self, k: int) -> None:
        self.k = k

    def times(self, x: int) -> int:
        return self.k * x

    def __call__(self, x: int) -> int:
        return self.k + x


def scale(a: int, b: int) -> int:
    return a * b


@pytest.mark.parametrize(
    "func, inner",
    [
        (functools.partial(scale, 2), scale),
        (functools.partial(functools.partial(scale), b=3), scale),
        (Scaler(2).times, Scaler.times),
        (functools.partial(Scaler(2).times), Scaler.times),
        (Scaler(2), Scaler),
    ],
    ids=["partial", "nested partial", "bound method", "partial of a method", "callable object"],
)
def test_a_wrapped_callable_registers_the_users_module_not_functools(func, inner) -> None:
    """A partial reports ``functools`` as its module: the user's module is what must
    travel by value (the whole payload is proven on a real job in
    tests/integration/core/jobs/test_callable_kinds.py)."""
    assert underlying(func) is inner
    with by_value(func, []):
        registered = set(cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES)
    assert __name__ in registered and "functools" not in registered
    assert __name__ not in cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES  # undone
    blob = pack_payload(func, (5,), {}, env_vars={}, has_data_refs=False)
    payload = cloudpickle.loads(blob)
    assert payload["func"](*payload["args"]) == func(5)


# ---- result ------------------------------------------------------------------------------


def test_dump_result_round_trip() -> None:
    blob, ok = dump_result(make_result(success=True, result={"v": [1, 2]}, host_index=2))
    assert ok is True
    back = cloudpickle.loads(blob)
    assert back == {
        "success": True,
        "result": {"v": [1, 2]},
        "exception": None,
        "traceback": None,
        "phase": "execute",
        "host_index": 2,
    }


def test_dump_result_falls_back_on_unpicklable_value() -> None:
    blob, ok = dump_result(make_result(success=True, result=threading.Lock(), host_index=0))
    assert ok is False
    back = cloudpickle.loads(blob)
    assert back["success"] is False and back["serialization_failed"] is True
    assert back["phase"] == "result serialization"
    assert isinstance(back["exception"], RuntimeError)
    assert "Result serialization failed" in str(back["exception"])
    assert "lock" in back["result_repr"]


def test_raise_remote_failure_adds_phase_and_traceback_notes() -> None:
    payload = make_result(
        success=False,
        exception=KeyError("missing"),
        traceback="Traceback: in boom",
        phase="execute",
    )
    with pytest.raises(KeyError) as info:
        raise_remote_failure(payload, "file:///r/result.pkl")
    notes = "\n".join(info.value.__notes__)
    assert "Failed during kinetic phase: execute" in notes
    assert "Remote traceback:\nTraceback: in boom" in notes


# ---- environment capture -----------------------------------------------------------------

ENVIRON = {
    "PATH": "/bin",
    "HOME": "/root",
    "PYTHONPATH": "/p",
    "PYTHONHASHSEED": "0",
    "WANDB_API": "w",
    "WANDB_PROJECT": "proj",
    "MY_VAR": "1",
    "OTHER": "2",
}


def test_capture_env_exact_names() -> None:
    assert capture_env(["MY_VAR", "ABSENT"], ENVIRON) == {"MY_VAR": "1"}
    # An exact name wins even when it is on the blocklist.
    assert capture_env(["PATH"], ENVIRON) == {"PATH": "/bin"}


def test_capture_env_prefix_pattern_skips_blocklist() -> None:
    assert capture_env(["WANDB_*"], ENVIRON) == {"WANDB_API": "w", "WANDB_PROJECT": "proj"}
    assert capture_env(["PYTHON*"], ENVIRON) == {"PYTHONHASHSEED": "0"}


def test_capture_env_star() -> None:
    got = capture_env(["*"], ENVIRON)
    assert set(got) == set(ENVIRON) - ENV_BLOCKLIST
    assert "PATH" not in got and "HOME" not in got and got["OTHER"] == "2"
    got = capture_env(["*", "PATH"], ENVIRON)
    assert got["PATH"] == "/bin" and "HOME" not in got


def test_capture_env_defaults_to_os_environ(monkeypatch) -> None:
    monkeypatch.setenv("KINETIC_TEST_CAPTURE_ME", "yes")
    assert capture_env(["KINETIC_TEST_CAPTURE_*"]) == {"KINETIC_TEST_CAPTURE_ME": "yes"}
    assert capture_env(None) == {} and capture_env([]) == {}
    assert os.environ["KINETIC_TEST_CAPTURE_ME"] == "yes"


def test_capture_env_rejects_bad_entries() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        capture_env(["OK", ""], ENVIRON)


def test_nested_by_value_scans_once_and_the_outermost_unregisters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prepare`` packs the payload and digests the call under one registration: the
    inner ``by_value`` of the same callable and roots scans no modules, and the
    registration lasts until the outermost one ends (it is what the digest pickles
    under), then is undone."""
    from airflow_provider_kinetic.core.jobs import byvalue
    from airflow_provider_kinetic.core.jobs.pack import prepare
    from airflow_provider_kinetic.core.jobs.request import JobRequest
    from airflow_provider_kinetic.core.jobs.work import call_digest
    from airflow_provider_kinetic.core.storage.local import LocalStore

    pkg = tmp_path / "dags"
    pkg.mkdir()
    (pkg / "nested_helpers_xyz.py").write_text("def double(x):\n    return 2 * x\n")
    scans = []
    real = byvalue._modules_under
    monkeypatch.setattr(byvalue, "_modules_under", lambda roots: scans.append(roots) or real(roots))
    registered = cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES
    sys.path.insert(0, str(pkg))
    try:
        import nested_helpers_xyz  # type: ignore[import-not-found]

        func, roots = nested_helpers_xyz.double, [str(pkg)]
        with by_value(func, roots):
            with by_value(func, roots):
                assert "nested_helpers_xyz" in registered
            assert "nested_helpers_xyz" in registered  # the inner end kept it
        assert "nested_helpers_xyz" not in registered and len(scans) == 1

        scans.clear()
        request = JobRequest(func=func, args=(3,), by_value_roots=roots)
        packed = prepare(request, LocalStore(str(tmp_path / "store")), env_vars={})
        assert len(scans) == 1  # the payload and the work digest: one scan
        assert "nested_helpers_xyz" not in registered
        # The digest is the one a registration of its own gives (the same work).
        assert packed.call_sha256 == call_digest(func, (3,), {}, [], {}, roots)
    finally:
        sys.path.remove(str(pkg))
        sys.modules.pop("nested_helpers_xyz", None)
