"""``airflow kinetic ...`` / ``python -m airflow_provider_kinetic.cli ...`` against jobs
and a data cache on the local backend (no mocks).

Commands run as the CLI's ``main`` in this process (``tests/fixtures/cli.py``): a new
process costs an Airflow import.  Real processes remain where the process is the
subject: ``jobs result`` of a failed job through each entry point (its exit status
and stderr), and ``jobs logs --follow`` while the job runs (``test_cli_stdout.py``
checks what reaches a real process's stdout and stderr)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from airflow import __version__ as airflow_version
from packaging.version import Version

from airflow_provider_kinetic.core.backends.local import venv as local_venv
from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR, LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data.cache import cache_key, marker_key
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.jobs.taskrecord import SYNC, TaskRecord, write_record
from airflow_provider_kinetic.core.runtime.context import context_key
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.cli import MODULE, REPO, _CallStream, run_cli, run_cli_process
from tests.fixtures.local_conn import cancel_jobs, set_local_conn
from tests.fixtures.tiny_wheel import write_wheel
from tests.fixtures.waiting import wait_for

CONN = "kn_cli"
#: How long a local job (a new Python process) may take to start or end.
DEADLINE_S = 120.0


def add(a: int, b: int) -> dict:
    print("adding", a, b, flush=True)
    return {"sum": a + b}


def wait_release(release: str) -> str:
    import os
    import time

    print("waiting", flush=True)
    while not os.path.exists(release):
        time.sleep(0.02)  # timing-ok: the remote job's workload, polling for its release
    return "released"


@pytest.fixture
def config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_home: Path
) -> Iterator[KineticConfig]:
    """A local connection; Airflow's metadata DB exists (``jobs cleanup`` reads XComs)."""
    root = tmp_path / "kinetic"
    set_local_conn(monkeypatch, root, CONN)
    yield KineticConfig(backend="local", root=str(root))
    cancel_jobs(root)  # never leave a job process behind


def submit(config: KineticConfig, func: Callable, *args: Any, **request: Any) -> JobHandle:
    backend = LocalBackend(config.bucket_name)
    req = JobRequest(func=func, args=args, **request)
    handle, _ = submit_job(req, config, backend, config.store(), deployment_secret())
    return handle


def finished(config: KineticConfig, handle: JobHandle) -> JobStatus:
    backend = LocalBackend(config.bucket_name)
    return wait_for(
        f"{handle.job_id} to end",
        lambda: (s := backend.status(handle).status).is_terminal and s,
        DEADLINE_S,
    )


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """The CLI with this module's connection, called in this process."""
    out = run_cli(*args, "--conn-id", CONN)
    if ok:
        assert out.returncode == 0, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
    return out


def as_json(*args: str) -> Any:
    """The command's JSON output (stdout holds nothing else)."""
    return json.loads(cli(*args, "--output", "json").stdout)


def test_list_status_logs_result_and_cleanup(config: KineticConfig):
    store = config.store()
    recorded = submit(config, add, 2, 3)
    by_output = submit(config, add, 4, 5, output_dir=store.uri("outputs/dag_b/run1/t/-1"))
    identity = {"dag_id": "dag_a", "run_id": "run1", "task_id": "sum", "map_index": -1}
    record = TaskRecord(kind="job", mode=SYNC, try_number=1, handle=recorded.to_dict())
    write_record(store, identity, record, deployment_secret())
    for handle in (recorded, by_output):
        assert finished(config, handle) is JobStatus.SUCCEEDED

    rows = {r["job_id"]: r for r in as_json("jobs", "list")}
    assert set(rows) == {recorded.job_id, by_output.job_id}
    assert rows[recorded.job_id]["dag_id"] == "dag_a"
    assert rows[recorded.job_id]["task_id"] == "sum"
    assert rows[by_output.job_id]["dag_id"] == "dag_b"  # from the default output layout
    assert {r["state"] for r in rows.values()} == {"SUCCEEDED"}
    only_a = as_json("jobs", "list", "--dag-id", "dag_a")
    assert [r["job_id"] for r in only_a] == [recorded.job_id]
    assert as_json("jobs", "list", "--state", "running") == []
    assert len(as_json("jobs", "list", "--limit", "1")) == 1
    table = cli("jobs", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["JOB_ID", "KIND", "STATE", "REASON"]
    assert any(line.startswith(recorded.job_id) and "SUCCEEDED" in line for line in table)

    status = as_json("jobs", "status", recorded.job_id)
    assert status["state"] == "SUCCEEDED" and status["func"] == recorded.func_name
    assert "adding 2 3" in cli("jobs", "logs", recorded.job_id).stdout
    assert as_json("jobs", "logs", recorded.job_id)["logs"].count("adding 2 3") == 1
    assert as_json("jobs", "result", recorded.job_id)["value"] == {"sum": 5}
    assert "'sum': 9" in cli("jobs", "result", by_output.job_id).stdout

    done = as_json("jobs", "cleanup", recorded.job_id)
    assert done[0]["action"] == "deleted" and done[0]["objects"] > 0
    assert not store.exists(f"{recorded.job_id}/handle.json")
    assert not (Path(config.bucket_name) / STATE_DIR / recorded.job_id).exists()
    # The history outlives the artifacts: the job is still listed, with its state and
    # its log (archived when the local state dir went).
    after = {r["job_id"]: r for r in as_json("jobs", "list")}
    assert set(after) == {recorded.job_id, by_output.job_id}
    assert after[recorded.job_id]["state"] == "SUCCEEDED"
    assert after[recorded.job_id]["artifacts"] == "deleted by jobs cleanup"
    assert as_json("jobs", "status", recorded.job_id)["state"] == "SUCCEEDED"
    assert "adding 2 3" in cli("jobs", "logs", recorded.job_id).stdout
    gone = cli("jobs", "status", "job-00000000", ok=False)
    assert gone.returncode == 1 and "no kinetic job 'job-00000000'" in gone.stderr


def test_cleanup_older_than(config: KineticConfig):
    handle = submit(config, add, 1, 1)
    assert finished(config, handle) is JobStatus.SUCCEEDED
    assert as_json("jobs", "cleanup", "--older-than", "1d") == []  # created just now
    store = config.store()
    old = json.loads(store.read_bytes(f"{handle.job_id}/handle.json"))
    old["created_at"] = "2020-01-01T00:00:00Z"
    store.write_bytes(f"{handle.job_id}/handle.json", json.dumps(old).encode())
    dry = as_json("jobs", "cleanup", "--older-than", "1d", "--dry-run")
    assert [(r["job_id"], r["action"]) for r in dry] == [(handle.job_id, "would delete")]
    assert store.exists(f"{handle.job_id}/handle.json")
    rows = as_json("jobs", "cleanup", "--older-than", "1d")
    assert [(r["job_id"], r["action"]) for r in rows] == [(handle.job_id, "deleted")]
    assert store.list(f"{handle.job_id}/") == []
    both = cli("jobs", "cleanup", handle.job_id, "--older-than", "1d", ok=False)
    assert both.returncode == 1 and "either a JOB id or --older-than" in both.stderr


def test_cancel_and_follow(config: KineticConfig, tmp_path: Path):
    release = tmp_path / "release"
    waiting = submit(config, wait_release, str(release))
    backend = LocalBackend(config.bucket_name)
    wait_for("the job to start", lambda: "waiting" in backend.read_logs(waiting)[0], DEADLINE_S)
    early = cli("jobs", "result", waiting.job_id, ok=False)
    assert early.returncode == 1 and "pass --wait" in early.stderr
    running = cli("jobs", "list", "--state", "RUNNING", "-o", "json").stdout
    assert [r["job_id"] for r in json.loads(running)] == [waiting.job_id]
    out = as_json("jobs", "cancel", waiting.job_id)
    assert out["cancel_requested"] is True
    assert (out["state"], out["reason"]) == ("FAILED", "cancelled")
    assert config.store().exists(f"{waiting.job_id}/cancel-requested")
    failed = cli("jobs", "result", waiting.job_id, ok=False)
    assert failed.returncode == 1 and f"kinetic job {waiting.job_id} failed" in failed.stderr

    # A real process: the test reads its output while it runs, and acts meanwhile.
    follow = submit(config, wait_release, str(release))
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "jobs", "logs", follow.job_id,
         "--follow", "--poll-interval", "0.05", "--conn-id", CONN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")  # ends if the command exits early
        assert "waiting" in (line.strip() for line in lines)  # printed while the job runs
        assert backend.status(follow).status is JobStatus.RUNNING
        release.touch()
        rest, _ = proc.communicate(timeout=DEADLINE_S)
        assert proc.returncode == 0  # --follow ends with the job
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert finished(config, follow) is JobStatus.SUCCEEDED
    assert cli("jobs", "result", follow.job_id).stdout.strip() == "released"


class TwoArgError(Exception):
    """Pickles as ``TwoArgError(message)``: the client cannot rebuild it."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")


def raise_two_arg(n: int) -> None:
    raise TwoArgError(f"E{n}", "the disk is on fire")


@pytest.mark.parametrize("airflow", [False, True], ids=["python-m", "airflow"])
def test_result_of_an_unrebuildable_remote_error(config: KineticConfig, airflow: bool):
    """``jobs result`` names the remote type, its message and its traceback.

    Each entry point once as a real process (the others in this module call ``main``):
    ``python -m airflow_provider_kinetic.cli``, and ``airflow kinetic`` through
    Airflow's own CLI, which adds the group from the provider's ``cli`` entry."""
    if airflow and Version(airflow_version).release < (3, 2):
        pytest.skip("Airflow 3.1 does not load provider CLI commands")
    handle = submit(config, raise_two_arg, 7)
    assert finished(config, handle) is JobStatus.FAILED
    out = run_cli_process("jobs", "result", handle.job_id, "--conn-id", CONN, airflow=airflow)
    assert out.returncode == 1 and "could not be deserialised" not in out.stderr
    name = f"{__name__}.TwoArgError"
    first = next(line for line in out.stderr.splitlines() if line.startswith("error: "))
    assert first == f"error: kinetic job {handle.job_id} failed: {name}: E7: the disk is on fire"
    tb = out.stderr[out.stderr.index("Remote traceback:") :]
    assert "Traceback (most recent call last):" in tb and ", in raise_two_arg\n" in tb
    assert f"{name}: E7: the disk is on fire" in tb.splitlines()[-1]


def test_data_ls_and_gc(config: KineticConfig):
    store = config.store()
    for digest in ("a" * 64, "b" * 64, "c" * 64):
        store.write_bytes(f"{cache_key(digest)}/file.txt", b"x" * 10)
    store.write_bytes(marker_key("a" * 64), b"")  # old and complete
    store.write_bytes(marker_key("b" * 64), b"")  # fresh and complete; "c": no marker
    store.write_bytes(context_key("d" * 64), b"zip")  # an old job context archive
    store.write_bytes(context_key("e" * 64), b"zip")  # a fresh one
    # The parts of two big uploads never composed: a killed client's (old), and one
    # that may still be composing (fresh).
    for part in (".kinetic-parts/left/00", ".kinetic-parts/left/01", ".kinetic-parts/now/00"):
        store.write_bytes(part, b"p" * 5)
    old = time.time() - 10 * 86400
    os.utime(store.uri(marker_key("a" * 64))[len("file://") :], (old, old))
    os.utime(store.uri(context_key("d" * 64))[len("file://") :], (old, old))
    for part in (".kinetic-parts/left/00", ".kinetic-parts/left/01"):
        os.utime(store.uri(part)[len("file://") :], (old, old))

    rows = {r["hash"]: r for r in as_json("data", "ls")}
    assert set(rows) == {"a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64}
    assert {h for h, r in rows.items() if r["kind"] == "context"} == {"d" * 64, "e" * 64}
    assert rows["a" * 64]["age_s"] > 9 * 86400 and rows["b" * 64]["age_s"] < 3600
    assert rows["c" * 64]["complete"] is False and rows["a" * 64]["bytes"] == 10
    assert "incomplete" in cli("data", "ls").stdout

    dry = as_json("data", "gc", "--older-than", "7d", "--dry-run")
    assert [(r["hash"], r["action"]) for r in dry] == [
        ("a" * 64, "would delete"),
        ("d" * 64, "would delete"),
        ("left", "would delete"),
    ]
    assert dry[-1]["kind"] == "upload parts" and (dry[-1]["files"], dry[-1]["bytes"]) == (2, 10)
    assert store.exists(marker_key("a" * 64)) and store.exists(context_key("d" * 64))
    assert store.exists(".kinetic-parts/left/00")
    gc = as_json("data", "gc", "--older-than", "7d")
    assert [(r["hash"], r["action"]) for r in gc] == [
        ("a" * 64, "deleted"),
        ("d" * 64, "deleted"),
        ("left", "deleted"),
    ]
    assert store.list(".kinetic-parts/") == [".kinetic-parts/now/00"]
    assert not store.exists(marker_key("a" * 64)) and not store.exists(context_key("d" * 64))
    assert store.exists(context_key("e" * 64))
    assert store.list(cache_key("a" * 64) + "/") == []
    assert store.exists(marker_key("b" * 64)) and store.exists(f"{cache_key('c' * 64)}/file.txt")

    bad = cli("data", "gc", "--older-than", "7 days", ok=False)
    assert bad.returncode == 1 and "bad age '7 days'" in bad.stderr


def test_data_gc_removes_unused_local_venvs_but_not_a_live_jobs(
    config: KineticConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Local jobs' requirements venvs are listed with their last use and collected when
    unused for ``--older-than``, except one a live job runs in; that job still ends
    well, and once it has ended its venv goes too."""
    wheels = tmp_path / "wheels"
    for version in ("0.0.1", "0.0.2", "0.0.3"):
        write_wheel(wheels, "kngcprobe", version, {"kngcprobe/__init__.py": "X = 1\n"})
    monkeypatch.setenv("KINETIC_LOCAL_FIND_LINKS", str(wheels))
    root = config.bucket_name
    old_unused = local_venv.ensure_venv(root, ["kngcprobe==0.0.1"])
    fresh = local_venv.ensure_venv(root, ["kngcprobe==0.0.3"])
    release = tmp_path / "release"
    busy = submit(config, wait_release, str(release), requirements=["kngcprobe==0.0.2"])
    log = LocalBackend(root).job_dir(busy.job_id) + "/log"
    wait_for(
        "the job", lambda: os.path.exists(log) and "waiting" in Path(log).read_text(), DEADLINE_S
    )
    others = [e.path for e in local_venv.list_venvs(root) if e.path not in (old_unused, fresh)]
    (busy_venv,) = others  # the job's own, built by its submit
    old = time.time() - 10 * 86400
    for path in (old_unused, busy_venv):
        os.utime(path, (old, old))

    listed = {r["path"]: r for r in as_json("data", "ls") if r["kind"] == "venv"}
    assert set(listed) == {old_unused, busy_venv, fresh}
    assert listed[old_unused]["age_s"] > 9 * 86400 and listed[fresh]["age_s"] < 3600
    assert listed[old_unused]["files"] > 0 and listed[old_unused]["bytes"] > 0

    dry = {r["path"]: r["action"] for r in as_json("data", "gc", "--older-than", "7d", "--dry-run")}
    assert dry == {old_unused: "would delete", busy_venv: "kept: a live job runs in it"}
    assert Path(old_unused).is_dir()
    gc = {r["path"]: r["action"] for r in as_json("data", "gc", "--older-than", "7d")}
    assert gc == {old_unused: "deleted", busy_venv: "kept: a live job runs in it"}
    assert not Path(old_unused).exists() and Path(busy_venv).is_dir() and Path(fresh).is_dir()
    assert [p.name for p in Path(root, local_venv.VENV_DIR).iterdir() if p.name[0] == "."] == []

    release.write_text("go")
    assert finished(config, busy) is JobStatus.SUCCEEDED
    assert cli("jobs", "result", busy.job_id).stdout.strip() == "released"
    gc = {r["path"]: r["action"] for r in as_json("data", "gc", "--older-than", "7d")}
    assert gc == {busy_venv: "deleted"} and Path(fresh).is_dir()


def test_accelerators():
    rows = as_json("accelerators")
    by_name = {r["name"]: r for r in rows}
    assert by_name["h100"]["kind"] == "gpu" and by_name["h100"]["gke"] == "nvidia-h100-80gb"
    assert by_name["v5litepod"]["topologies"]["4"] == "2x2"
    # Every accepted spelling: names, aliases, GKE labels (TPU labels also without "tpu-").
    assert by_name["v5litepod"]["spellings"] == [
        "v5litepod", "v5e", "tpu-v5-lite-podslice", "v5-lite-podslice",
    ]  # fmt: skip
    assert by_name["h200"]["spellings"] == ["h200", "nvidia-h200-141gb"]
    assert by_name["tpu7x"]["aliases"] == ["ironwood", "v7x"]
    # Hosts per slice, chips per host, host CPU and capacity kinds, per size.
    v6e = by_name["v6e"]
    assert v6e["sizes"] == "1/4/8/16/32/64/128/256"
    assert (v6e["hosts"]["1"], v6e["hosts"]["8"], v6e["hosts"]["256"]) == (1, 2, 64)
    assert (v6e["chips_per_host"]["1"], v6e["chips_per_host"]["8"]) == (1, 4)
    assert v6e["machine_types"]["1"] == "ct6e-standard-1t" and v6e["arch"] == "amd64"
    assert by_name["gb200"]["arch"] == "arm64" and by_name["gb200"]["hosts"] == {"4": 1}
    assert "flex-start" in v6e["capacity"]["1"] and "flex-start" not in v6e["capacity"]["8"]
    assert "on-demand" in v6e["capacity"]["8"] and "spot" in by_name["l4"]["capacity"]["1"]
    table = cli("accelerators").stdout
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("KIND"))
    assert header.split() == [
        "KIND", "NAME", "ALIASES", "ARCH", "SIZES", "HOSTS", "CHIPS_PER_HOST", "CAPACITY",
        "EXAMPLE",
    ]  # fmt: skip
    [gb200] = [ln for ln in lines if ln.split()[:2] == ["gpu", "gb200"]]
    assert gb200.split()[2:5] == ["nvidia-gb200", "arm64", "4"]
    [v5e] = [ln for ln in lines if ln.split()[:2] == ["tpu", "v5litepod"]]
    assert "v5e, tpu-v5-lite-podslice" in v5e and "1/1/1/4/8/16/32/64" in v5e
    assert "1/4/8/4/4/4/4/4" in v5e  # chips per host: the 8-chip slice is one 8-chip VM


def test_an_in_process_call_leaves_the_process_as_it_found_it(capfd: pytest.CaptureFixture[str]):
    """``run_cli`` (what this module's tests call) restores the streams, the environment
    and logging, and captures the command's output apart from pytest's capture; what
    a logger made during the call writes later reaches the stderr of that time."""
    root = logging.getLogger()
    handlers = [(h, getattr(h, "stream", None)) for h in root.handlers]
    before = (sys.stdout, sys.stderr, dict(os.environ), root.level, structlog.get_config())
    listed = run_cli("accelerators", "-o", "json", env={"KINETIC_CLI_PROBE": "1"})
    bad = run_cli("jobs", "list", "--state", "sideways")
    usage = run_cli("jobs", "nope")
    after = (sys.stdout, sys.stderr, dict(os.environ), root.level, structlog.get_config())
    assert after == before
    assert [(h, getattr(h, "stream", None)) for h in root.handlers] == handlers
    assert listed.returncode == 0 and json.loads(listed.stdout)
    assert (bad.returncode, bad.stdout) == (1, "") and "unknown state 'sideways'" in bad.stderr
    assert usage.returncode == 2 and "invalid choice: 'nope'" in usage.stderr
    assert "sideways" not in "".join(capfd.readouterr())

    stream = _CallStream("stderr")
    stream.write("during")
    assert stream.end() == "during"
    stream.write("after\n")
    assert capfd.readouterr().err == "after\n"
