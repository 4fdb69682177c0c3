"""Bad input fails in ``submit_job`` before anything is uploaded or launched, with a
message that names the offending value and where it was."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.catalog.accelerators import InvalidAcceleratorError
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.payload import UnpicklableArgumentError
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import LocalStore


class RecordingBackend(LocalBackend):
    """A local-kind backend that records calls and starts nothing."""

    def __init__(self) -> None:
        super().__init__("/nonexistent")
        self.calls: list[tuple[str, Any]] = []

    def submit(self, spec) -> None:
        self.calls.append(("submit", spec))

    def status(self, handle) -> StatusReport:
        self.calls.append(("status", handle))
        return StatusReport(JobStatus.NOT_FOUND)

    def read_logs(self, handle, offset=0):
        return "", offset

    def cancel(self, handle) -> None:
        self.calls.append(("cancel", handle))


def noop(*args, **kwargs):
    return None


@pytest.fixture
def env(tmp_path: Path):
    root = tmp_path / "store"
    good = tmp_path / "good"
    good.mkdir()
    (good / "f.txt").write_text("valid data that must not be uploaded")
    config = KineticConfig(backend="local", root=str(root))
    return config, LocalStore(str(root)), RecordingBackend(), Data(str(good))


def stored_files(store: LocalStore) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(store.bucket) for f in fs]


def submit_fails(env, exc_type, accelerator: str = "cpu", **request: Any) -> str:
    config, store, backend, good = env
    request.setdefault("args", (good,))
    with pytest.raises(exc_type) as info:
        options = JobOptions(accelerator=accelerator)  # a bad one fails here, as it is made
        submit_job(JobRequest(func=noop, options=options, **request), config, backend, store)
    assert stored_files(store) == [], "nothing may be uploaded before validation passes"
    assert backend.calls == [], "the backend must not be asked to create anything"
    return str(info.value)


def test_control_a_valid_request_does_upload_and_submit(env) -> None:
    config, store, backend, good = env
    handle, _ = submit_job(JobRequest(func=noop, args=(good,)), config, backend, store)
    assert stored_files(store) and [c[0] for c in backend.calls] == ["submit"]
    assert store.exists(f"{handle.job_id}/payload.pkl")


@pytest.mark.parametrize("value", ["gpu-h999", "tpu-v9z-4", "quantum", "gpu:3"])
def test_unknown_accelerator(env, value: str) -> None:
    msg = submit_fails(env, InvalidAcceleratorError, accelerator=value)
    assert repr(value) in msg
    assert "Allowed forms" in msg and '"tpu-v5e-4"' in msg and '"cpu"' in msg


def test_missing_data_path_in_kwargs(env, tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such" / "dir")
    msg = submit_fails(env, FileNotFoundError, kwargs={"data": Data(missing)})
    assert "op_kwargs['data']" in msg and missing in msg


def test_missing_data_path_nested_in_args(env, tmp_path: Path) -> None:
    config, store, backend, good = env
    missing = str(tmp_path / "gone.csv")
    msg = submit_fails(env, FileNotFoundError, args=(good, [{"x": Data(missing)}]))
    assert "op_args[1][0]['x']" in msg and missing in msg


def test_missing_volume_data(env, tmp_path: Path) -> None:
    missing = str(tmp_path / "vol-missing")
    msg = submit_fails(env, FileNotFoundError, volumes={"/mnt/v": Data(missing)})
    assert "volumes['/mnt/v']" in msg and missing in msg


@pytest.mark.parametrize("mount", ["data/train", "./x", ""])
def test_relative_volume_mount_path(env, mount: str) -> None:
    config, store, backend, good = env
    msg = submit_fails(env, ValueError, volumes={mount: good})
    assert repr(mount) in msg and "absolute" in msg


def test_reserved_volume_mount_path(env) -> None:
    config, store, backend, good = env
    msg = submit_fails(env, ValueError, volumes={"/_kinetic/fuse-data/0": good})
    assert "'/_kinetic/fuse-data/0'" in msg and "reserved" in msg


def test_volume_value_must_be_data(env) -> None:
    msg = submit_fails(env, TypeError, volumes={"/mnt/v": "/some/path"})
    assert "'/mnt/v'" in msg and "Data" in msg


@pytest.mark.parametrize(
    "where, build",
    [
        ("op_kwargs['lock']", lambda good: {"kwargs": {"n": 1, "lock": threading.Lock()}}),
        ("op_args[1]", lambda good: {"args": (good, threading.Lock())}),
    ],
)
def test_unpicklable_argument(env, where: str, build) -> None:
    msg = submit_fails(env, UnpicklableArgumentError, **build(env[3]))
    assert where in msg and "lock" in msg.lower()


def test_op_kwargs_over_the_default_64_mib_payload_cap(env) -> None:
    """The default ``[kinetic] max_payload_mb`` (64): 65 MiB of op_kwargs fail before
    any upload, naming the size, the cap, the option, the argument and ``Data``."""
    from airflow_provider_kinetic.core.jobs.pack import PayloadTooLargeError

    blob = b"\0" * (65 * 2**20)
    msg = submit_fails(env, PayloadTooLargeError, kwargs={"blob": blob, "n": 1})
    assert "is 65.0 MiB, over the 64 MiB cap ([kinetic] max_payload_mb = 64)" in msg
    assert "Largest: op_kwargs['blob'] 65.0 MiB. Arguments travel" in msg  # not the tiny
    assert "pass large data as Data(path) instead" in msg
    assert "AIRFLOW__KINETIC__MAX_PAYLOAD_MB; 0 disables it" in msg


def test_the_payload_cap_is_configurable_and_0_turns_it_off(env) -> None:
    from airflow_provider_kinetic.core.jobs.pack import PayloadTooLargeError

    config, store, backend, good = env
    kwargs = {"blob": b"\0" * (2 * 2**20)}
    msg = submit_fails(env, PayloadTooLargeError, kwargs=kwargs, max_payload_mb=1.5)
    assert "over the 1.5 MiB cap ([kinetic] max_payload_mb = 1.5)" in msg
    request = JobRequest(func=noop, args=(good,), kwargs=kwargs, max_payload_mb=0)
    handle, _ = submit_job(request, config, backend, store)
    assert store.exists(f"{handle.job_id}/payload.pkl")


def test_data_in_a_set(env) -> None:
    config, store, backend, good = env
    msg = submit_fails(env, TypeError, kwargs={"paths": {good}})
    assert re.search(r"set.*op_kwargs\['paths'\]", msg)


def test_unsupported_data_scheme(env) -> None:
    msg = submit_fails(env, ValueError, kwargs={"src": Data("s3://bucket/x")})
    assert "op_kwargs['src']" in msg and "s3://bucket/x" in msg


def test_bad_capture_env_entry(env) -> None:
    msg = submit_fails(env, ValueError, capture_env_vars=["OK", ""])
    assert "capture_env_vars" in msg


@pytest.mark.parametrize(
    ("volumes", "match"),
    [
        ({"/": None}, "would hide '/'"),
        ({"/etc": None}, "inside the system directory /etc"),
        ({"/usr/local/data": None}, "inside the system directory /usr"),
        ({"/var/lib/x": None}, "inside the system directory /var"),
        ({"/tmp": None}, "would hide '/tmp'"),
        ({"/mnt/../etc": None}, "contains '..'"),
        ({"/mnt/x/..": None}, "contains '..'"),
        ({"//etc/x": None}, "inside the system directory /etc"),
        ({"/mnt/a": None, "/mnt/a/": None}, "are the same path '/mnt/a'"),
        ({"/mnt/a": None, "/mnt//a": None}, "are the same path '/mnt/a'"),
        ({"/mnt/a": None, "/mnt/a/b": None}, "are nested"),
        ({"/mnt/a/b": None, "/mnt/a": None}, "are nested"),
        ({"/_kinetic/fuse-data": None}, "reserved"),
    ],
)
def test_dangerous_mount_paths_are_refused_before_any_upload(env, volumes, match) -> None:
    good = env[3]
    msg = submit_fails(env, ValueError, volumes=dict.fromkeys(volumes, good))
    assert re.search(match, msg), msg
    assert next(iter(volumes)) in msg  # the message names the path as given


def test_safe_mount_paths_pass(env) -> None:
    from airflow_provider_kinetic.core.data.mounts import check_mount_paths

    paths = ["/mnt/a", "/mnt/b", "/data/x/y", "/tmp/work", "/etcetera", "/mnt/ab"]
    assert check_mount_paths(paths, "/_kinetic/fuse-data") == {p: p for p in paths}
