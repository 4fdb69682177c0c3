"""Debug mode end to end on the local backend: a real runner subprocess starts debugpy,
a real Debug Adapter Protocol client (``tests/fixtures/dap.py``) attaches over the
socket as VS Code would, sets a breakpoint in the user's function, sees it hit,
continues, and the task succeeds with the function's value; without a client the job
fails once ``debug_wait`` has passed, saying so."""

from __future__ import annotations

import inspect
import json
import socket
import threading
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.cli.debug import jobs_debug
from airflow_provider_kinetic.core.spec.debug import READY_NAME
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.exceptions import KineticJobFailed
from tests.fixtures.dap import DapClient
from tests.fixtures.fake_ti import FakeTI, StateStore
from tests.fixtures.waiting import wait_for


def stepped(x: int) -> int:
    doubled = x * 2
    total = doubled + 1  # the test's breakpoint
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _line_of(func: Any, marker: str) -> int:
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _start(op: KineticRunOperator) -> tuple[dict[str, Any], threading.Thread, dict[str, Any]]:
    ctx = {"ti": FakeTI(task_id=op.task_id), "task_state_store": StateStore()}
    out: dict[str, Any] = {}

    def execute() -> None:
        try:
            out["value"] = op.execute(ctx)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            out["error"] = exc

    worker = threading.Thread(target=execute, name="task", daemon=True)
    worker.start()
    return ctx, worker, out


def test_a_debugger_attaches_stops_at_a_breakpoint_and_the_task_succeeds(
    local_conn: Path, capfd: Any
) -> None:
    port = free_port()
    op = KineticRunOperator(
        task_id="stepped",
        python_callable=stepped,
        op_args=[20],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
        requirements=[],
        debug=True,
        debug_port=port,
    )
    ctx, worker, out = _start(op)
    try:
        marker = wait_for(
            "the debug job's ready marker",
            lambda: next(local_conn.glob(f"*/{READY_NAME}"), None) or out.get("error"),
        )
        assert isinstance(marker, Path), marker
        ready = json.loads(marker.read_text())
        assert (ready["host"], ready["port"]) == ("127.0.0.1", port)
        # `airflow kinetic jobs debug JOB` on this machine: the address and launch.json.
        before = "".join(capfd.readouterr())
        jobs_debug(Namespace(job_id=marker.parent.name, conn_id="kinetic_local", port=None))
        printed = capfd.readouterr().out
        assert f"debugpy listens on 127.0.0.1:{port}" in printed
        launch = json.loads(printed.split("detaching lets it finish):\n", 1)[1])
        assert launch["configurations"][0]["connect"] == {"host": "127.0.0.1", "port": port}
        assert launch["configurations"][0]["pathMappings"][0]["remoteRoot"] == ready["code_root"]
        jobs_debug(Namespace(job_id=marker.parent.name, conn_id="kinetic_local", port=None,
                             output="json"))  # fmt: skip
        as_json = json.loads(capfd.readouterr().out)  # one object, alone on stdout
        assert (as_json["port"], as_json["pod"], as_json["launch"]) == (port, None, launch)
        client = DapClient("127.0.0.1", port)
        try:
            line = _line_of(stepped, "the test's breakpoint")
            client.attach({inspect.getsourcefile(stepped): [line]})
            stopped = client.event("stopped")
            assert stopped["body"]["reason"] == "breakpoint"
            thread = stopped["body"]["threadId"]
            frames = client.request("stackTrace", threadId=thread)["body"]["stackFrames"]
            assert (frames[0]["name"], frames[0]["line"]) == ("stepped", line)
            scope = client.request("scopes", frameId=frames[0]["id"])["body"]["scopes"][0]
            names = client.request("variables", variablesReference=scope["variablesReference"])
            seen = {v["name"]: v["value"] for v in names["body"]["variables"]}
            assert seen["x"] == "20" and seen["doubled"] == "40"
            client.request("continue", threadId=thread)
            # The function returns and the runner exits: the adapter says so, and a
            # client (VS Code) detaches then; the job's process ends with it.
            client.event("terminated")
            client.request("disconnect")
        finally:
            client.close()
    finally:
        worker.join(timeout=180)
    assert "error" not in out, out.get("error")
    assert out["value"] == 41
    job_id = JobHandle.from_dict(ctx["ti"].xcom["kinetic_job"]).job_id
    log = before + printed + "".join(capfd.readouterr())  # the task log (stdout)
    told = log.split(f"kinetic debug job {job_id} waits up to 1800s (debug_wait)", 1)[1]
    assert f"`airflow kinetic jobs debug {job_id}`" in told.splitlines()[0]
    assert f"127.0.0.1:{port}" in told.splitlines()[0]


def test_without_a_debugger_the_job_fails_after_debug_wait(local_conn: Path) -> None:
    op = KineticRunOperator(
        task_id="unattended",
        python_callable=stepped,
        op_args=[1],
        kinetic_conn_id="kinetic_local",
        deferrable=False,
        poll_interval=0.1,
        requirements=[],
        debug=True,
        debug_port=free_port(),
        debug_wait=2,
    )
    _, worker, out = _start(op)
    worker.join(timeout=180)
    assert not worker.is_alive()
    with pytest.raises(KineticJobFailed, match=r"no debugger attached within debug_wait=2s"):
        raise out["error"]
