"""A store that cannot be read is no answer about a job (``core.jobs.polling.StoreOutage``,
``core.backends.local_presence``): polls retry it with backoff for a window, the local
backend never says NOT_FOUND for it, and a trigger's config never recreates a root.
The live-supervisor case runs on real processes in
tests/integration/faults/test_faults_outage.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR, LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.polling import OUTAGE_MAX_S, StoreOutage
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.storage import StoreUnavailable
from tests.fixtures import records


def test_an_outage_is_retried_with_backoff_until_its_window_passes():
    outage = StoreOutage(window_s=600)
    exc = StoreUnavailable("away")
    assert outage.recovered() is None  # no outage yet
    delays = [outage.failed(exc) for _ in range(7)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, OUTAGE_MAX_S, OUTAGE_MAX_S]
    assert "giving up in 600s" in outage.describe(exc, delays[-1])
    assert outage.recovered() is not None and outage.recovered() is None
    assert outage.failed(exc) == 0.5  # a new outage starts from the first wait again
    outage.since = time.monotonic() - 601  # the window has passed
    with pytest.raises(StoreUnavailable, match="away"):
        outage.failed(exc)


def test_the_last_wait_ends_with_the_window():
    outage = StoreOutage(window_s=600)
    outage.failed(OSError("x"))
    outage.since = time.monotonic() - 599.5
    assert outage.failed(OSError("x")) <= 0.5


def test_an_unreadable_store_is_never_not_found(tmp_path: Path):
    root = tmp_path / "store"
    backend = LocalBackend(str(root))
    job = records.handle("job-00000001", str(root))
    with pytest.raises(StoreUnavailable, match="does not exist"):
        backend.status(job)
    with pytest.raises(StoreUnavailable, match="does not exist"):
        backend.batch_status("grp-1", [job])
    root.write_text("")  # not a directory
    with pytest.raises(StoreUnavailable, match="cannot be read"):
        backend.status(job)
    root.unlink()
    root.mkdir()  # a readable store without the job (and no supervisor): really gone
    assert backend.status(job).status is JobStatus.NOT_FOUND
    assert backend.batch_status("grp-1", [job])[job.job_id].status is JobStatus.NOT_FOUND
    assert not backend.exists(job)
    (root / STATE_DIR / job.job_id).mkdir(parents=True)  # present: read as before
    assert backend.status(job).status is JobStatus.PENDING


def test_a_triggers_config_never_recreates_a_missing_root(tmp_path: Path):
    from airflow_provider_kinetic.deployment.connection import config_from_json, config_to_json

    root = tmp_path / "store"
    config = KineticConfig(backend="local", root=str(root))  # checked: created
    assert root.is_dir()
    os.rmdir(root)
    rebuilt = config_from_json(config_to_json(config))
    assert rebuilt == config and not root.exists()
    assert json.loads(config_to_json(rebuilt)) == json.loads(config_to_json(config))
    KineticConfig(backend="local", root=str(root))  # a submit's config still creates it
    assert root.is_dir()
