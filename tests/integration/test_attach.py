"""``attach`` from a fresh process: status, logs, result and cancel of a job another
process submitted; the XCom handle dict loads into it too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_provider_kinetic import KineticRunOperator, attach
from tests.fixtures.fake_ti import FakeTI
from tests.fixtures.local_conn import set_local_conn

REPO = Path(__file__).resolve().parents[2]


def slow_sum(a: int, b: int, release: str) -> int:
    import os
    import time

    print("summing", flush=True)
    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the job's workload polls the test's release file
    return a + b


@pytest.fixture
def conn(monkeypatch, tmp_path) -> str:
    set_local_conn(monkeypatch, tmp_path / "kinetic", "kn_attach")
    return "kn_attach"


def fresh_process(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def submit(conn: str, tmp_path: Path, release: Path) -> dict:
    op = KineticRunOperator(
        task_id="t", python_callable=slow_sum, op_args=[2, 3, str(release)],
        kinetic_conn_id=conn, wait_for_completion=False,
    )  # fmt: skip
    return op.execute({"ti": FakeTI()})


def test_attach_by_id_from_a_fresh_process(conn, tmp_path):
    release = tmp_path / "release"
    handle = submit(conn, tmp_path, release)
    job = attach(handle, conn_id=conn)  # the XCom dict loads into it
    assert job.status().status.value in ("PENDING", "RUNNING")
    release.touch()
    out = fresh_process(
        f"""
        from airflow_provider_kinetic import attach
        job = attach({handle["job_id"]!r}, conn_id={conn!r})
        print("RESULT", job.result(timeout=60, poll_interval=0.05))
        print("STATUS", job.status().status.value)
        print("LOG", "summing" in job.logs())
        print("CLEANED", job.cleanup() > 0)
        """
    )
    assert "RESULT 5" in out and "STATUS SUCCEEDED" in out
    assert "LOG True" in out and "CLEANED True" in out


def test_cancel_from_a_fresh_process(conn, tmp_path):
    handle = submit(conn, tmp_path, tmp_path / "never")
    out = fresh_process(
        f"""
        from airflow_provider_kinetic import attach
        job = attach({handle["job_id"]!r}, conn_id={conn!r})
        job.cancel()
        report = job.status()
        print("STATUS", report.status.value, report.reason)
        try:
            job.result(timeout=30, poll_interval=0.05)
        except Exception as exc:
            print("ERROR", type(exc).__name__)
        """
    )
    assert "STATUS FAILED cancelled" in out and "ERROR" in out
