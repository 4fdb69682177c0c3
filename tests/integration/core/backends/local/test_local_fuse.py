"""FUSE data on the local backend: served read-only straight from the data cache."""

from __future__ import annotations

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from tests.fixtures.waiting import ended, wait_for


def peek(folder: str, single: str, mounted: str) -> dict:
    import os
    import stat

    return {
        "folder": folder,
        "files": sorted(os.listdir(folder)),
        "single": open(single).read(),
        "single_mode": stat.S_IMODE(os.stat(single).st_mode),
        "mounted": sorted(os.listdir(mounted)),
    }


def test_fuse_data_resolves_to_read_only_cache_paths(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.bin").write_bytes(b"x")
    (tmp_path / "cfg.json").write_text('{"a": 1}')
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    handle, _ = submit_job(
        JobRequest(
            func=peek,
            kwargs={
                "folder": Data(str(tmp_path / "dir"), fuse=True),
                "single": Data(str(tmp_path / "cfg.json"), fuse=True),
                "mounted": str(tmp_path / "mnt"),
            },
            volumes={str(tmp_path / "mnt"): Data(str(tmp_path / "dir"), fuse=True)},
        ),
        config,
        backend,
    )
    report = wait_for(
        f"job {handle.job_id} to end",
        lambda: ended(backend.status(handle)),
        detail=lambda: backend.read_logs(handle)[0],
    )
    value = collect(config.store(), handle.job_id, report.status)
    cache = str(tmp_path / "store" / "default" / "data-cache")
    assert value["folder"].startswith(cache) and value["files"] == ["x.bin"]
    assert value["single"] == '{"a": 1}' and value["single_mode"] == 0o444
    assert value["mounted"] == ["x.bin"]  # the FUSE volume, linked at its mount path
    # Nothing was copied for FUSE data: the job's temp dir holds no data download.
    assert "downloaded" not in backend.read_logs(handle)[0]
