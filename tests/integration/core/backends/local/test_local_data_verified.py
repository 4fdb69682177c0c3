"""Every byte a function reads on the local backend was verified: a data-cache entry
read in place (a volume's link, a ``Data(fuse=True)`` path) is hashed against its name
first.  A byte flipped in the cache is caught at submit while the Data's source is
there (the entry is uploaded again), or, flipped after the submit, fails the job
before the function runs (class infra, phase data resolve), naming the entry, and the
retry uploads it again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.backends.local.slots import SLOTS_ENV
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import cache_key, marker_key
from airflow_provider_kinetic.core.jobs.finish import failure_of
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.failure import FailureClass
from airflow_provider_kinetic.core.spec.handles import JobStatus
from tests.fixtures.local_jobs import finish, run
from tests.fixtures.waiting import wait_for

TRUE_BYTES = b"the bytes the function must see"


def contents(path: str, ran: str = "") -> dict[str, bytes]:
    """The job: every file under ``path`` (a directory or one file), by relative path;
    with ``ran``, it first leaves a mark that it ran."""
    if ran:
        Path(ran).write_text("ran")
    if os.path.isfile(path):
        return {os.path.basename(path): Path(path).read_bytes()}
    found = {}
    for dirpath, _, names in os.walk(path, followlinks=True):
        for name in names:
            full = os.path.join(dirpath, name)
            found[os.path.relpath(full, path)] = Path(full).read_bytes()
    return found


def hold(started: str, release: str) -> None:
    """A job that holds the only job slot until the test releases it."""
    import time

    Path(started).write_text("")
    deadline = time.monotonic() + 300
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)  # timing-ok: the job's own workload, held until the test releases it


def flip(path: Path) -> None:
    """Flip one bit of a (read-only) cached file, as a bad disk or a stray write would."""
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[4] ^= 0x01
    path.write_bytes(bytes(data))
    path.chmod(0o444)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(TRUE_BYTES)
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
    return src


def test_a_byte_flipped_in_the_cache_is_caught_at_submit_and_uploaded_again(
    config: KineticConfig, backend: LocalBackend, source: Path, tmp_path: Path
) -> None:
    want = contents(str(source))
    assert run(config, backend, JobRequest(func=contents, args=(Data(str(source)),))) == want
    entry = Path(config.bucket_name, cache_key(Data(str(source)).content_hash()))
    flip(entry / "a.txt")
    mount = tmp_path / "mnt" / "data"
    volume = JobRequest(func=contents, args=(str(mount),), volumes={str(mount): Data(str(source))})
    assert run(config, backend, volume) == want
    flip(entry / "a.txt")
    fuse = JobRequest(func=contents, args=(Data(str(source), fuse=True),))
    assert run(config, backend, fuse) == want
    assert contents(str(entry)) == want  # the entry was uploaded again from the source
    single = source / "a.txt"
    one = JobRequest(func=contents, args=(Data(str(single), fuse=True),))
    assert run(config, backend, one) == {"a.txt": TRUE_BYTES}
    flip(Path(config.bucket_name, cache_key(Data(str(single)).content_hash()), "a.txt"))
    assert run(config, backend, one) == {"a.txt": TRUE_BYTES}


@pytest.mark.parametrize("fuse", [False, True], ids=["volume", "fuse"])
def test_a_byte_flipped_after_the_submit_fails_the_job_before_the_function(
    config: KineticConfig,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fuse: bool,
) -> None:
    """The data job waits for the only job slot while the byte is flipped: its runner
    finds the entry bad, names it, removes it, and never calls the function; the
    retry's submit uploads the entry again and the function sees the true bytes."""
    monkeypatch.setenv(SLOTS_ENV, str(tmp_path / "slots"))  # this test's slots only
    backend = LocalBackend(config.bucket_name, max_jobs=1)
    data = Data(str(source), fuse=fuse)
    want = contents(str(source))
    assert run(config, backend, JobRequest(func=contents, args=(data,))) == want  # cached
    digest = data.content_hash()
    entry = Path(config.bucket_name, cache_key(digest))
    started, release, ran = tmp_path / "started", tmp_path / "release", tmp_path / "ran"
    blocker, _ = submit_job(
        JobRequest(func=hold, args=(str(started), str(release))), config, backend
    )
    wait_for("the job holding the slot to start", started.exists)
    mount = str(tmp_path / "mnt" / "data")
    request = (
        JobRequest(func=contents, args=(data, str(ran)))
        if fuse
        else JobRequest(func=contents, args=(mount, str(ran)), volumes={mount: data})
    )
    handle, _ = submit_job(request, config, backend)
    wait_for("the data job to queue", lambda: backend.status(handle).status is JobStatus.PENDING)
    flip(entry / "a.txt")
    release.write_text("")
    assert finish(backend, blocker).status is JobStatus.SUCCEEDED
    report = finish(backend, handle)
    log = backend.read_logs(handle)[0]
    assert report.status is JobStatus.FAILED, log
    assert not ran.exists(), "the function ran on a corrupt entry"
    used = f"Data({entry.as_uri()!r}, fuse=True)" if fuse else f"the volume at {mount}"
    assert f"data cache entry {entry} ({used}) is bad: expected content hash {digest}" in log
    assert "found " in log and "refused before the function ran" in log
    failure = failure_of(config.store(), handle, report, None)  # what failed, and where
    assert failure is not None and (failure.failure_class, failure.phase) == (
        FailureClass.INFRA, "data resolve",
    )  # fmt: skip
    assert not entry.exists() and not Path(config.bucket_name, marker_key(digest)).exists()
    assert not os.path.lexists(mount)  # no link was made
    assert run(config, backend, request) == want  # the retry: uploaded again
    assert contents(str(entry)) == want
