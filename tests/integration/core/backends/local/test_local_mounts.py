"""Local backend volumes: links at host mount paths, shared by reference count, removed
by the last job; an existing path is an error naming it; nothing else is written."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data, locallinks
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus
from tests.fixtures.waiting import ended, wait_for


def hold(mount: str, release: str, started: str) -> list[str]:
    import os

    seen = sorted(os.listdir(mount))
    open(started, "w").close()
    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    return seen


def test_concurrent_jobs_share_a_mount_link_and_the_last_removes_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("1")
    mount = tmp_path / "mnt" / "train"
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    release = [tmp_path / "release-0", tmp_path / "release-1"]
    started = [tmp_path / "started-0", tmp_path / "started-1"]
    handles = [
        submit_job(
            JobRequest(
                func=hold, args=(str(mount), str(r), str(s)), volumes={str(mount): Data(str(data))}
            ),
            config,
            backend,
        )[0]
        for r, s in zip(release, started, strict=True)
    ]
    wait_for("both jobs to hold the link", lambda: all(s.exists() for s in started))
    assert mount.is_symlink()
    release[0].touch()
    first = handles[0]
    report = wait_for("the first job to end", lambda: ended(backend.status(first)))
    assert report.status is JobStatus.SUCCEEDED, backend.read_logs(first)[0]
    assert mount.is_symlink()  # the second job still uses it
    release[1].touch()
    report = wait_for("the second job to end", lambda: ended(backend.status(handles[1])))
    assert report.status is JobStatus.SUCCEEDED
    assert collect(config.store(), handles[1].job_id, report.status) == ["x.csv"]
    assert not os.path.lexists(mount)  # the last user removed the link
    assert (data / "x.csv").read_text() == "1"


def test_an_existing_mount_path_fails_the_job_naming_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("1")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    request = JobRequest(func=len, args=("x",), volumes={str(taken): Data(str(data))})
    handle, _ = submit_job(request, config, backend)
    report = wait_for("the job to end", lambda: ended(backend.status(handle)))
    assert report.status is JobStatus.FAILED
    with pytest.raises(RuntimeError, match=f"data resolve failed: FileExistsError: .*{taken}"):
        collect(config.store(), handle.job_id, report.status)
    assert (taken / "keep.txt").read_text() == "mine" and sorted(os.listdir(taken)) == ["keep.txt"]


def test_a_link_to_other_content_is_refused(tmp_path):
    mount, a, b = tmp_path / "m", tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    locallinks.acquire(str(mount), str(a))
    with pytest.raises(FileExistsError, match="already taken by a link to"):
        locallinks.acquire(str(mount), str(b))
    locallinks.acquire(str(mount), str(a))
    locallinks.release(str(mount), str(a))
    assert Path(mount).is_symlink()
    locallinks.release(str(mount), str(a))
    assert not os.path.lexists(mount)
