"""Authenticated results on real processes: the runner signs with its job's key (a 0600
secret file on the local backend), the worker verifies before unpickling anything."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local.backend import SECRETS_FILE, LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.signing import (
    AUTH_HMAC,
    AUTH_NONE,
    ResultAuthError,
    job_key,
)
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus
from tests.fixtures.waiting import ended, wait_for

SECRET = os.urandom(32)


def answer(x: int) -> dict:
    return {"x": x, "pid": os.getpid()}


def run(tmp_path: Path, x: int, secret: bytes | None = SECRET):
    config = KineticConfig(backend="local", root=str(tmp_path / "store"))
    backend = LocalBackend(config.bucket_name)
    handle, spec = submit_job(JobRequest(func=answer, args=(x,)), config, backend, None, secret)
    report = wait_for(
        f"job {handle.job_id} to end",
        lambda: ended(backend.status(handle)),
        detail=lambda: backend.read_logs(handle)[0],
    )
    assert report.status is JobStatus.SUCCEEDED, backend.read_logs(handle)[0]
    return config.store(), backend, handle, spec


class Boom:
    """Unpickling this runs ``open(marker, "w")``: the side effect must never happen."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_signed_result_round_trip_and_key_never_on_disk(tmp_path):
    store, backend, handle, spec = run(tmp_path, 7)
    key = job_key(SECRET, handle.job_id)
    assert handle.result_auth == AUTH_HMAC
    assert collect(store, handle.job_id, JobStatus.SUCCEEDED, result_key=key)["x"] == 7
    assert store.exists(f"{handle.job_id}/result.pkl.sig")
    jdir = Path(backend.job_dir(handle.job_id))
    assert stat.S_IMODE(jdir.stat().st_mode) == 0o700
    assert stat.S_IMODE((jdir / "spec.json").stat().st_mode) == 0o600
    assert not (jdir / SECRETS_FILE).exists()  # read and deleted by the supervisor
    # The key (and the peers' token, core/keys/peer/registry.py) is nowhere in the store, the
    # job dir or the spec's env (only a reference).
    token = spec.secrets["KINETIC_PEER_TOKEN"]
    for root in (Path(store.bucket), jdir):
        for path in root.rglob("*"):
            if path.is_file():
                assert key.encode() not in path.read_bytes(), path
                assert token.encode() not in path.read_bytes(), path
    assert "KINETIC_RESULT_KEY" not in spec.env and "KINETIC_PEER_TOKEN" not in spec.env
    assert spec.secrets == {"KINETIC_RESULT_KEY": key, "KINETIC_PEER_TOKEN": token}


@pytest.mark.parametrize("attack", ["substituted", "truncated", "unsigned", "crafted"])
def test_bad_results_are_refused_before_unpickling(tmp_path, attack):
    store, _, handle, _ = run(tmp_path / "a", 1)
    key = job_key(SECRET, handle.job_id)
    target = f"{handle.job_id}/result.pkl"
    marker = tmp_path / "side-effect"
    if attack == "substituted":  # another job's genuine, signed result
        other_store, _, other, _ = run(tmp_path / "b", 2)
        store.write_bytes(target, other_store.read_bytes(f"{other.job_id}/result.pkl"))
        store.write_bytes(target + ".sig", other_store.read_bytes(f"{other.job_id}/result.pkl.sig"))
    elif attack == "truncated":
        store.write_bytes(target, store.read_bytes(target)[:-10])
    elif attack == "unsigned":
        (Path(store.bucket) / (target + ".sig")).unlink()
        store.write_bytes(target, pickle.dumps({"success": True, "result": "forged"}))
    else:
        store.write_bytes(target, pickle.dumps(Boom(str(marker))))
    with pytest.raises(ResultAuthError, match=handle.job_id) as info:
        collect(store, handle.job_id, JobStatus.SUCCEEDED, result_key=key)
    assert ("not signed" in str(info.value)) is (attack == "unsigned")
    assert not marker.exists()


def test_unsigned_jobs_are_accepted_only_when_submitted_that_way(tmp_path):
    store, _, handle, spec = run(tmp_path, 3, secret=None)  # as for kinetic's own runner
    assert handle.result_auth == AUTH_NONE and not spec.secrets
    assert not store.exists(f"{handle.job_id}/result.pkl.sig")
    assert collect(store, handle.job_id, JobStatus.SUCCEEDED)["x"] == 3
    with pytest.raises(ResultAuthError, match="not signed"):
        collect(store, handle.job_id, JobStatus.SUCCEEDED, result_key=job_key(SECRET, "x"))
