"""Failures that say what failed, on the real local backend: a KineticRunOperator try
(``execute`` in this process, real runner subprocesses) whose function raises, is
killed by a signal, or exceeds its memory limit (an rlimit), and whose requirements
cannot be installed, ends with the typed exception of its class, the phase it failed
in, one task-log line saying so, the failure in XCom ``kinetic_job``, in the job's
history entry, ``jobs status`` and the Kinetic page; ``retry_on`` re-submits only the classes it
names, counted in the task's record.  (A Data entry that is bad at the job's start:
``data resolve``, in ``test_local_data_verified``.)"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic import (
    KineticInfraError,
    KineticRunOperator,
    KineticUserError,
)
from airflow_provider_kinetic.core.backends.local.venv import LocalVenvError
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import read_record
from airflow_provider_kinetic.core.spec.failure import FailureClass
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.exceptions import KineticJobFailed
from airflow_provider_kinetic.operators.common import task_identity
from airflow_provider_kinetic.plugins.jobs import list_rows
from tests.fixtures.cli import run_cli
from tests.fixtures.fake_ti import FakeTI, StateStore


def raises(x: int) -> None:
    raise ValueError(f"bad value {x}")


def killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def over_its_memory_limit() -> int:
    """Limits its own address space (as a memory limit would), then asks for more."""
    import resource

    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + 256 * 2**20, hard))
    return len(bytearray(4 * 2**30))


def context(task_id: str) -> dict[str, Any]:
    return {"ti": FakeTI(task_id=task_id), "task_state_store": StateStore()}


def operator(task_id: str, func: Any, **kw: Any) -> KineticRunOperator:
    kw.setdefault("requirements", [])
    return KineticRunOperator(
        task_id=task_id,
        python_callable=func,
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
        **kw,
    )


class Failed:
    """What a failed try raised, and what it logged (wherever Airflow's logging sent it)."""

    def __init__(self, op: KineticRunOperator, ctx: dict[str, Any], capfd: Any, caplog: Any):
        with caplog.at_level(logging.INFO), pytest.raises(KineticJobFailed) as caught:
            op.execute(ctx)
        self.exc = caught.value
        self.text = "".join(capfd.readouterr()) + caplog.text


def fail(op: KineticRunOperator, ctx: dict[str, Any], capfd: Any, caplog: Any) -> Failed:
    return Failed(op, ctx, capfd, caplog)


def test_a_raising_function_is_a_user_error_in_execute(local_conn: Path, capfd, caplog) -> None:
    ctx = context("raises")
    got = fail(operator("raises", raises, op_args=[7]), ctx, capfd, caplog)
    exc = got.exc
    assert type(exc) is KineticUserError
    failure = exc.failure
    assert (failure.failure_class, failure.phase, failure.exit_code) == (
        FailureClass.USER_ERROR, "execute", 1,
    )  # fmt: skip
    assert failure.exception_type == "builtins.ValueError"
    assert isinstance(exc.__cause__, ValueError) and str(exc.__cause__) == "bad value 7"
    line = f"kinetic job {exc.job_id} failed in phase execute (user_error), exit code 1: "
    assert line + "ValueError: bad value 7" in got.text
    pushed = ctx["ti"].xcom["kinetic_job"]
    assert pushed["job_id"] == exc.job_id and pushed["failure"]["class"] == "user_error"
    entry = history.read(LocalStore(str(local_conn)), exc.job_id)
    assert entry["state"] == "FAILED" and entry["failure"]["phase"] == "execute"
    assert "re-submit" not in got.text  # user errors get none by default
    status = run_cli("jobs", "status", exc.job_id, "--conn-id", "kinetic_local", "-o", "json")
    assert status.returncode == 0, status.stderr
    said = "failed in phase execute (user_error), exit code 1: ValueError: bad value 7"
    assert json.loads(status.stdout)["failure"] == said
    (row,) = [r for r in list_rows("kinetic_local") if r.handle.job_id == exc.job_id]
    assert row.report.reason == said  # the Kinetic page's row (and the task tab's)


def test_a_killed_function_is_infra_and_retry_on_resubmits_it_once(
    local_conn: Path, capfd, caplog
) -> None:
    ctx = context("killed")
    got = fail(operator("killed", killed, retry_on={"infra": 1}), ctx, capfd, caplog)
    exc = got.exc
    assert type(exc) is KineticInfraError
    failure = exc.failure
    assert (failure.failure_class, failure.phase, failure.exit_code) == (
        FailureClass.INFRA, None, 128 + signal.SIGKILL,
    )  # fmt: skip
    assert failure.reason == "killed by SIGKILL" and exc.__cause__ is not None
    assert "(infra re-submit 1/1;" in got.text
    assert "and the task's 1 infra re-submits are used up" in got.text
    store = LocalStore(str(local_conn))
    record = read_record(store, task_identity(ctx), deployment_secret())
    assert record is not None and record.resubmits == {"infra": 1}
    first, second = record.attempts
    assert second == exc.job_id
    assert history.read(store, first)["failure"]["class"] == "infra"  # the re-submitted one
    usage = ctx["ti"].xcom["kinetic_usage"]  # what each failure class cost
    assert usage["failures"]["infra"]["attempts"] == 2 and "failed: 2 infra" in got.text


def test_a_memory_limit_exceeded_is_infra(local_conn: Path, capfd, caplog) -> None:
    got = fail(operator("oom", over_its_memory_limit), context("oom"), capfd, caplog)
    exc = got.exc
    assert type(exc) is KineticInfraError
    assert (exc.failure.phase, exc.failure.exception_type) == ("execute", "builtins.MemoryError")
    assert isinstance(exc.__cause__, MemoryError)


def test_a_failing_requirements_install_is_infra(
    local_conn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd, caplog
) -> None:
    monkeypatch.setenv("KINETIC_LOCAL_FIND_LINKS", str(tmp_path / "wheels"))
    (tmp_path / "wheels").mkdir()
    op = operator("reqs", raises, op_args=[1], requirements=["kinetic-no-such-pkg"])
    got = fail(op, context("reqs"), capfd, caplog)
    exc = got.exc
    assert type(exc) is KineticInfraError
    assert (exc.failure.failure_class, exc.failure.phase) == (
        FailureClass.INFRA, "requirements install",
    )  # fmt: skip
    assert isinstance(exc.__cause__, LocalVenvError)
    assert "failed in phase requirements install (infra)" in got.text
