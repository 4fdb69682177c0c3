"""Captured env values are secrets: delivered as a 0600 file (local) / a Kubernetes
Secret (GKE), masked in logs, and written nowhere: not the store, payload, spec,
manifest, handle, XCom, rendered fields, task logs or job logs."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pendulum

from tests.fixtures.airflow_env import task_states, xcoms


def files_containing(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def test_a_printed_secret_is_nowhere_on_disk_and_masked_in_the_log(
    load_dag, airflow_home, monkeypatch, capfd
):
    secret = "kn-" + uuid.uuid4().hex
    monkeypatch.setenv("KN_SECRET_TOKEN", secret)
    dag = load_dag("kinetic_secret_dags.py", "kinetic_secret")
    dr = dag.test(logical_date=pendulum.datetime(2026, 11, 23, tz="UTC"))
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert x[("single", "return_value")] == len(secret)
    assert x[("batch", "return_value")] == [len(secret), len(secret)]
    # The job printed it; the task log shows it masked.
    assert "single: the token is ***" in out
    assert secret not in out
    # Nowhere on disk: Airflow home (metadata DB, logs, DAGs), the store, job dirs.
    assert files_containing(airflow_home, secret.encode()) == []
    jobs = airflow_home / "kinetic" / ".local-jobs"
    assert not list(jobs.rglob("secrets.json"))  # the 0600 file is gone with its job
    # The jobs' logs, archived in the store's history when their state dirs went.
    logs = [p.read_text() for p in (airflow_home / "kinetic" / "history").rglob("log.txt")]
    assert any("single: the token is ***" in text for text in logs)
    assert any("child-1: the token is ***" in text for text in logs)
    assert os.environ["KN_SECRET_TOKEN"] == secret
