"""Data is what the user pointed at: empty directories (the Data itself, or inside
it) exist in the job as arguments and as volumes, on the local backend and through a
gs:// store (fake-gcs-server); a symlinked directory or a dangling link inside a Data
tree is refused, naming it, before anything is uploaded.

Empty directories are not in kinetic's content hash, so two trees that differ only in
them share one data-cache entry: each Data's ref carries its own empty directories.
"""

from __future__ import annotations

import os
from pathlib import Path

import cloudpickle
import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data, DataPathError
from airflow_provider_kinetic.core.data.refs import is_data_ref
from airflow_provider_kinetic.core.jobs.pack import prepare
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore
from tests.fixtures.waiting import ended, wait_for
from tests.integration.runner.test_runner import read_result, run_runner, stage

#: The directories (every level) a job must see in ``tree()``; ``twin()`` has the same
#: files, so the same hash, with other empty directories.
TREE_DIRS = ["empty-dir", "sub", "sub/also-empty", "sub/also-empty/nested"]
TWIN_DIRS = ["other-empty", "sub"]
#: The ref key (wire form: a literal, as kinetic's keys are).
EMPTY_DIRS = "empty_dirs"


def tree(root: Path, empties: tuple[str, ...] = ("empty-dir", "sub/also-empty/nested")) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "x.txt").write_text("x")
    for rel in empties:
        (root / rel).mkdir(parents=True)
    return root


def twin(root: Path) -> Path:
    return tree(root, ("other-empty",))


def survey(**paths: str) -> dict:
    """Per path: whether it is a directory, its directories and files (all levels)."""
    import os

    def walk(top: str) -> dict:
        dirs, files = [], []
        for d, ds, fs in os.walk(top):
            dirs += [os.path.relpath(os.path.join(d, n), top) for n in ds]
            files += [os.path.relpath(os.path.join(d, n), top) for n in fs]
        return {"is_dir": os.path.isdir(top), "dirs": sorted(dirs), "files": sorted(files)}

    return {name: walk(path) for name, path in paths.items()}


def expected(dirs: list[str]) -> dict:
    return {"is_dir": True, "dirs": dirs, "files": ["a.txt", "sub/x.txt"]}


EMPTY = {"is_dir": True, "dirs": [], "files": []}


def finish(backend: LocalBackend, config: KineticConfig, handle: JobHandle):
    report = wait_for(
        f"job {handle.job_id} to end",
        lambda: ended(backend.status(handle)),
        detail=lambda: backend.read_logs(handle)[0],
    )
    log = backend.read_logs(handle)[0]
    assert report.status is JobStatus.SUCCEEDED, log
    return collect(config.store(), handle.job_id, report.status), log


# ---- the local backend -------------------------------------------------------------


@pytest.mark.parametrize("fuse", [False, True], ids=["copy", "fuse"])
def test_empty_dirs_reach_the_job_on_the_local_backend(tmp_path, config, backend, fuse):
    data, other, void = tree(tmp_path / "data"), twin(tmp_path / "twin"), tmp_path / "void"
    void.mkdir()
    mnt = tmp_path / "mnt"
    volumes = {str(mnt / "tree"): Data(str(data), fuse), str(mnt / "void"): Data(str(void), fuse)}
    request = JobRequest(
        func=survey,
        kwargs={
            "tree": Data(str(data), fuse),
            "twin": Data(str(other), fuse),
            "void": Data(str(void), fuse),
            "tree_volume": str(mnt / "tree"),
            "void_volume": str(mnt / "void"),
        },
        volumes=volumes,
    )
    assert Data(str(data)).content_hash() == Data(str(other)).content_hash()  # one entry
    handle, _ = submit_job(request, config, backend)
    value, _ = finish(backend, config, handle)
    assert value == {
        "tree": expected(TREE_DIRS),
        "twin": expected(TWIN_DIRS),
        "void": EMPTY,
        "tree_volume": expected(TREE_DIRS),
        "void_volume": EMPTY,
    }
    # The shared cache entry holds files only; the links went with the job.
    cache = Path(config.bucket_name, "default", "data-cache")
    entry = cache / Data(str(data)).content_hash()
    assert sorted(p.name for p in entry.iterdir()) == ["a.txt", "sub"]
    assert sorted(p.name for p in (entry / "sub").iterdir()) == ["x.txt"]
    assert not os.path.lexists(mnt / "tree") and not os.path.lexists(mnt / "void")


def test_the_ref_carries_empty_dirs_and_only_when_there_are_some(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    data, plain = tree(tmp_path / "data"), tree(tmp_path / "plain", ())
    packed = prepare(JobRequest(func=len, args=(Data(str(data)), Data(str(plain)))), store, {})
    refs = cloudpickle.loads(packed.payload)["args"]
    assert all(is_data_ref(r) for r in refs) and refs[0]["uri"] == refs[1]["uri"]
    assert refs[0][EMPTY_DIRS] == ["empty-dir", "sub/also-empty/nested"]
    assert EMPTY_DIRS not in refs[1]  # otherwise exactly kinetic's ref dict
    assert not store.list("")  # nothing uploaded by packing


# ---- the runner against a file:// store and a gs:// store ----------------------------


def test_empty_dirs_reach_a_pod_through_the_store(store: ObjectStore, tmp_path: Path) -> None:
    """A pod downloads Data from the store (gs:// on GKE): arguments and volumes."""
    data, other, void = tree(tmp_path / "data"), twin(tmp_path / "twin"), tmp_path / "void"
    void.mkdir()
    mnt = tmp_path / "mnt"
    request = JobRequest(
        func=survey,
        kwargs={
            "tree": Data(str(data)),
            "twin": Data(str(other)),
            "void": Data(str(void)),
            "tree_volume": str(mnt / "tree"),
            "void_volume": str(mnt / "void"),
        },
        volumes={str(mnt / "tree"): Data(str(data)), str(mnt / "void"): Data(str(void))},
    )
    proc = run_runner(stage(store, request))
    assert proc.returncode == 0, proc.stderr
    assert read_result(store, request.job_id)["result"] == {
        "tree": expected(TREE_DIRS),
        "twin": expected(TWIN_DIRS),
        "void": EMPTY,
        "tree_volume": expected(TREE_DIRS),
        "void_volume": EMPTY,
    }


# ---- symlinks inside a Data tree ------------------------------------------------------


@pytest.mark.parametrize("link", ["to-a-directory", "dangling"])
@pytest.mark.parametrize("where", ["argument", "volume"])
def test_a_refused_link_fails_the_submit_before_any_upload(tmp_path, link, where):
    data = tree(tmp_path / "data")
    target = tmp_path / "elsewhere" if link == "to-a-directory" else tmp_path / "gone.txt"
    if link == "to-a-directory":
        target.mkdir()
        (target / "inner.txt").write_text("inner")
    os.symlink(target, data / "sub" / "the-link")
    store = tmp_path / "store"
    config = KineticConfig(backend="local", root=str(store))
    backend = LocalBackend(config.bucket_name)
    d = Data(str(data))
    if where == "argument":
        request = JobRequest(func=len, args=(d,))
    else:
        request = JobRequest(func=len, volumes={str(tmp_path / "mnt"): d})
    kind = "symlink to a directory" if link == "to-a-directory" else "dangling symlink"
    with pytest.raises(DataPathError) as info:
        submit_job(request, config, backend)
    msg = str(info.value)
    assert repr(str(data)) in msg and repr(str(data / "sub" / "the-link")) in msg
    assert kind in msg and "must point to a regular file" in msg
    assert not any(p.is_file() for p in store.rglob("*"))  # nothing uploaded or written
