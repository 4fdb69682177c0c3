"""``-o json`` output is alone on stdout: ``airflow kinetic ...`` and ``python -m
airflow_provider_kinetic.cli ...`` as real processes, the way a person's shell runs
them (no ``kinetic_default`` connection, so commands that change the store warn that
jobs run on this machine and read-only ones do not; Airflow not in unit-test mode),
against a real local job.

Warnings, log lines and child processes' output go to stderr (``cli/output.py``), so
``json.loads(stdout)`` holds for every command with JSON output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from airflow import __version__ as airflow_version
from packaging.version import Version

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.deployment.signing import deployment_secret

REPO = Path(__file__).resolve().parents[3]
# Every command with JSON output; "{job}" is a finished job's id.
JSON_COMMANDS = (
    ("jobs", "list"),
    ("jobs", "status", "{job}"),
    ("jobs", "logs", "{job}"),
    ("jobs", "result", "{job}"),
    ("jobs", "cancel", "{job}"),
    # --force: this home has no Airflow database to read XComs from.
    ("jobs", "cleanup", "--older-than", "1d", "--dry-run", "--force"),
    ("data", "ls"),
    ("data", "gc", "--older-than", "7d", "--dry-run", "--force"),
    ("accelerators",),
)
FALLBACK_WARNING = "No 'kinetic_default' connection: jobs run ON THIS MACHINE"
#: Commands that only read: no warning that jobs run on this machine (issue 21).
READ_ONLY = {("jobs", "list"), ("jobs", "status"), ("jobs", "logs"), ("jobs", "result"),
             ("data", "ls"), ("accelerators",)}  # fmt: skip


def add(a: int, b: int) -> dict:
    print("adding", a, b, flush=True)
    return {"sum": a + b}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "airflow-home"


@pytest.fixture
def config(home: Path) -> KineticConfig:
    """The store the local fallback uses: ``$AIRFLOW_HOME/kinetic`` (the conftest's
    ``backend`` fixture cancels whatever job a failing test leaves running)."""
    return KineticConfig(backend="local", root=str(home / "kinetic"))


def user_env(home: Path) -> dict[str, str]:
    """A person's shell: no ``kinetic_default`` connection, and Airflow not in
    unit-test mode (that mode logs a notice on stdout while ``import airflow`` runs,
    before any provider code can act)."""
    drop = ("AIRFLOW__CORE__UNIT_TEST_MODE", "AIRFLOW_CONN_KINETIC_DEFAULT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "AIRFLOW_HOME": str(home), "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("airflow", [False, True], ids=["python-m", "airflow"])
def test_json_output_alone_on_stdout_and_the_fallback_warning_on_stderr(
    config: KineticConfig, backend: LocalBackend, home: Path, airflow: bool
):
    if airflow and Version(airflow_version).release < (3, 2):
        pytest.skip("Airflow 3.1 does not load provider CLI commands")
    req = JobRequest(func=add, args=(2, 3))
    job, _ = submit_job(req, config, backend, config.store(), deployment_secret())
    backend.wait([job], 60)
    assert backend.status(job).status is JobStatus.SUCCEEDED
    env = user_env(home)
    module = "airflow" if airflow else "airflow_provider_kinetic.cli"
    entry = [sys.executable, "-m", module, *(["kinetic"] if airflow else [])]

    def run(args: tuple[str, ...]) -> subprocess.CompletedProcess:
        argv = [*entry, *(a.format(job=job.job_id) for a in args), "-o", "json"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)

    first = run(JSON_COMMANDS[0])  # alone: Airflow writes $AIRFLOW_HOME/airflow.cfg
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        outs = [first, *pool.map(run, JSON_COMMANDS[1:])]
    values = {}
    for args, out in zip(JSON_COMMANDS, outs, strict=True):
        assert out.returncode == 0, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
        try:
            values[args[:2]] = json.loads(out.stdout)
        except ValueError:
            pytest.fail(f"{args}: stdout is not JSON alone:\n{out.stdout[:3000]}")
        # Read-only commands run no job: the warning is for those that change the store.
        warned = FALLBACK_WARNING in out.stderr
        assert warned is (args[:2] not in READ_ONLY), f"{args}\nstderr:{out.stderr[-3000:]}"
    assert [r["job_id"] for r in values["jobs", "list"]] == [job.job_id]
    assert values["jobs", "status"]["state"] == "SUCCEEDED"
    assert values["jobs", "result"]["value"] == {"sum": 5}
    assert values["jobs", "cancel"]["cancel_requested"] is False
    assert "adding 2 3" in values["jobs", "logs"]["logs"]
    assert values["data", "ls"] and values["data", "gc"] == []  # the job's fresh context
    assert {r["name"] for r in values["accelerators",]} >= {"h100", "v5litepod"}


_NOISY_ACTION = """
import json, logging, subprocess, sys, warnings
import airflow  # Airflow's logging and warnings set up as for the CLI
import structlog
from airflow_provider_kinetic.cli.common import command
cached = structlog.get_logger("kinetic.probe.cached").bind()  # made on stdout, now

@command
def noisy(args):
    warnings.warn("probe: python warning", UserWarning)
    cached.warning("probe: cached structlog logger")
    structlog.get_logger("kinetic.probe.new").warning("probe: new structlog logger")
    logging.getLogger("kinetic.probe").warning("probe: stdlib logger")
    subprocess.run([sys.executable, "-c", "print('probe: child process')"], check=True)
    print(json.dumps({"ok": True}))

noisy(None)
"""


def test_warnings_logs_and_children_of_an_action_go_to_stderr(home: Path):
    """Whatever an action's code reaches (Python warnings, structlog loggers made before
    or during it, stdlib loggers, child processes) writes to stderr, not stdout."""
    out = subprocess.run([sys.executable, "-c", _NOISY_ACTION], capture_output=True,
                         text=True, timeout=120, env=user_env(home))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == '{"ok": true}\n', out.stdout
    for probe in ("python warning", "cached structlog", "new structlog", "stdlib", "child"):
        assert f"probe: {probe}" in out.stderr, (probe, out.stderr[-3000:])
