"""A model of "the same work" and "still needed" (docs/IDENTITY.md, docs/LIVENESS.md),
checked against the real thing by a Hypothesis state machine.

One task (``model / manual__m / t``) runs ``KineticRunOperator.execute`` in this process
(a fake task instance, ``tests/fixtures/fake_ti.py``) against a real local store and
backend: every job is a real runner process.  The task's function lives in a module
file the test rewrites (its ``VERSION`` constant: the code) and reads a ``Data`` file
(the input); it appends one line per run to a file and returns ``v{VERSION}:{data}``.

Steps: a try that runs to its end (a retry under the same try number or the next);
a try whose worker dies once its job is submitted (the job held running) or once its
job ended (nothing delivered); the job cancelled (``jobs cancel``); a new version of
the code; new bytes in the Data file; ``jobs cleanup`` (the retention form, and
``--older-than 0s``); ``data gc --older-than 0s``; a ``store put`` of a key.

After every step: (1) every delivered value is the current code's for the current
input; (2) the function ran exactly as often as the model says (an unchanged retry
adopts or collects the job of its work, never runs it again); (3) nothing a live
holder names is gone (the Data of every job in the history, the running job's
artifacts, an undelivered succeeded job's result while something holds it, each kept
version of the key); (4) every job's history entry says what happened to it.

The tries' XComs stay in the fake task instance (not in Airflow's database), so the
holders ``jobs cleanup`` and ``data gc`` read from XComs are absent here: the model
says what that allows (``--older-than 0s`` deletes an ended job's artifacts).

``HYPOTHESIS_PROFILE=kinetic-release`` runs many more and longer sequences
(docs/TESTING.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import cache_key, marker_key
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.taskrecord import read_record
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures.cli import run_cli
from tests.fixtures.fake_ti import FakeTI, StateStore
from tests.fixtures.local_conn import cancel_jobs, conn_env, local_extra, set_local_conn
from tests.fixtures.waiting import wait_for

CONN = "kinetic_model"
IDENTITY = {"dag_id": "model", "run_id": "manual__m", "task_id": "t", "map_index": -1}
KEY = "models/m"
#: A try of other work that finds the earlier try's job ended does not write how it
#: ended: its history entry stays SUBMITTED (NOT_FOUND after ``jobs cleanup``).  The
#: state machine skips that one check while this is true; the regression test below
#: fails (strict xfail) once it is fixed, and then this goes.
KNOWN_GAP = True

settings.register_profile(
    "kinetic-bounded",
    max_examples=8,
    stateful_step_count=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "kinetic-release",
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

WORK = """\
import os
import time

VERSION = {version}


def work(src, runs, gate):
    with open(src) as f:
        data = f.read()
    with open(runs, "a") as f:
        f.write(f"{{VERSION}} {{data}}\\n")
    while os.path.exists(gate):  # held until the test releases it
        time.sleep(0.05)  # timing-ok: the job's workload, held until the test releases it
    return f"v{{VERSION}}:{{data}}"
"""


class WorkerDied(Exception):
    """The try's worker is gone (as after a SIGKILL): nothing after this point ran."""


@dataclass
class Job:
    """What the model knows of one job: the work it runs and what became of it."""

    job_id: str
    work: tuple[int, str]
    state: str  # "running" | "succeeded" | "cancelled"
    delivered: bool = False
    #: Its artifacts were deleted (``jobs cleanup``): nothing can collect it.
    gone: bool = False
    #: Something saw it ended (a try collected it, ``jobs cleanup`` asked its backend):
    #: its history entry says how it ended.  Until then a job that ended while nobody
    #: watched may still read SUBMITTED.
    seen_end: bool = False
    #: A try of other work found it ended and did not collect it (``KNOWN_GAP``).
    superseded_ended: bool = False


@dataclass
class Model:
    version: int = 1
    data: int = 0
    try_number: int = 1
    runs: int = 0
    jobs: list[Job] = field(default_factory=list)
    key_puts: int = 0

    @property
    def work(self) -> tuple[int, str]:
        return (self.version, f"data-{self.data}")

    @property
    def latest(self) -> Job | None:
        """The job the task's record names."""
        return self.jobs[-1] if self.jobs else None

    def reusable(self) -> Job | None:
        """The job a try of the current work adopts or collects, if any."""
        job = self.latest
        if job and not job.delivered and not job.gone and job.work == self.work:
            return job if job.state in ("running", "succeeded") else None
        return None


class IdentityMachine(RuleBasedStateMachine):
    def __init__(self, base: Path) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="model-", dir=base))
        self.root = self.dir / "kinetic"
        os.environ.update(conn_env(CONN, local_extra(self.root)))
        self.store = LocalStore(str(self.root))
        self.backend = LocalBackend(str(self.root))
        self.src, self.runs, self.gate = self.dir / "input", self.dir / "runs", self.dir / "gate"
        self.modname = f"kinetic_model_work_{self.dir.name.replace('-', '_')}"
        self.module: Any = None
        self.state_store = StateStore()
        self.m = Model()

    # ---- the system's side -----------------------------------------------------------
    def write_code(self) -> None:
        path = self.dir / f"{self.modname}.py"
        path.write_text(WORK.format(version=self.m.version))
        spec = importlib.util.spec_from_file_location(self.modname, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[self.modname] = module
        spec.loader.exec_module(module)
        self.module = module

    def write_data(self) -> None:
        self.src.write_text(f"data-{self.m.data}")

    def operator(self) -> KineticRunOperator:
        return KineticRunOperator(
            task_id="t",
            python_callable=self.module.work,
            op_kwargs={"src": Data(str(self.src)), "runs": str(self.runs), "gate": str(self.gate)},
            kinetic_conn_id=CONN,
            poll_interval=0.1,
        )

    def context(self, try_number: int) -> dict[str, Any]:
        ti = FakeTI(dag_id="model", run_id="manual__m", task_id="t", try_number=try_number)
        return {"ti": ti, "task_state_store": self.state_store}

    def ran(self) -> int:
        return self.runs.read_text().count("\n") if self.runs.exists() else 0

    def recorded_job(self) -> str | None:
        record = read_record(self.store, IDENTITY, deployment_secret())
        return record.job.job_id if record and record.job else None

    def status(self, job_id: str) -> Any:
        record = read_record(self.store, IDENTITY, deployment_secret())
        assert record is not None and record.job is not None and record.job.job_id == job_id
        return self.backend.status(record.job)

    def entry(self, job_id: str) -> dict:
        return history.read(self.store, job_id) or {}

    # ---- the model's side ------------------------------------------------------------
    def started(self, reused: Job | None) -> Job:
        """The job a try went on with, as the model predicts it: the one it reused, or
        a new one (whose function then runs once more); the record must name it."""
        job_id = self.recorded_job()
        if reused is not None:
            assert job_id == reused.job_id, f"{job_id} instead of reusing {reused}"
            return reused
        assert job_id not in {j.job_id for j in self.m.jobs}, f"{job_id} reused: {self.m}"
        latest = self.m.latest
        if latest and latest.state == "running":
            latest.state = "cancelled"  # other work: the new try cancels it
        elif latest and latest.state == "succeeded" and not latest.delivered:
            latest.seen_end = latest.superseded_ended = True  # other work: not collected
        job = Job(str(job_id), self.m.work, "running")
        self.m.jobs.append(job)
        self.m.runs += 1
        return job

    def next_try(self, same: bool) -> int:
        if not same:
            self.m.try_number += 1
        return self.m.try_number

    @initialize()
    def start(self) -> None:
        self.write_code()
        self.write_data()

    @rule(same=st.booleans())
    def full_try(self, same: bool) -> None:
        """A try that runs to its end.  A held job is released once the try starts to
        wait: by then it has cancelled one of other work, or adopted it."""
        reused = self.m.reusable()
        ctx = self.context(self.next_try(same))
        op = self.operator()

        def released(run: Any, handle: Any, deadline: Any) -> Any:
            self.gate.unlink(missing_ok=True)
            return KineticRunOperator._wait_sync(op, run, handle, deadline)

        op._wait_sync = released
        value = op.execute(ctx)
        job = self.started(reused)
        job.state, job.delivered, job.seen_end = "succeeded", True, True
        want = "v{}:{}".format(*self.m.work)
        assert value == want, f"delivered {value!r}, the current work gives {want!r}"
        assert ctx["ti"].xcom["return_value"] == want  # pushed before anything is deleted

    @rule(after_end=st.booleans())
    def dying_try(self, after_end: bool) -> None:
        """A try whose worker dies once its job is submitted (held running), or once its
        job ended (its result never delivered)."""
        reused = self.m.reusable()
        if reused is not None and reused.state == "succeeded":
            return  # such a try collects and delivers: ``full_try``
        if after_end:
            self.gate.unlink(missing_ok=True)
        else:
            self.gate.touch()
        runs = self.ran()
        op = self.operator()

        def died(run: Any, handle: Any, deadline: Any) -> None:
            if after_end:
                wait_for("the job to end", lambda: run.backend.status(handle).status.is_terminal)
            raise WorkerDied

        op._wait_sync = died  # the worker is killed where it starts to wait
        with pytest.raises(WorkerDied):
            op.execute(self.context(self.next_try(False)))
        job = self.started(reused)
        if reused is None:
            wait_for("the new job to run", lambda: self.ran() == runs + 1)
        if after_end:
            job.state = "succeeded"

    @precondition(lambda self: self.m.latest is not None and self.m.latest.state == "running")
    @rule()
    def cancel(self) -> None:
        job = self.m.latest
        assert job is not None
        out = run_cli("jobs", "cancel", job.job_id, "--conn-id", CONN, "-o", "json")
        assert out.returncode == 0, out.stderr[-3000:]
        wait_for("the job to end", lambda: self.status(job.job_id).status.is_terminal)
        job.state = "cancelled"

    @rule(version=st.integers(1, 3))
    def change_code(self, version: int) -> None:
        """The module rewritten and loaded again: new code, earlier code, or the same
        text again (which is the same work)."""
        self.m.version = version
        self.write_code()

    @rule(data=st.integers(0, 2))
    def change_data(self, data: int) -> None:
        """The Data file rewritten: new bytes, earlier bytes, or the same bytes."""
        self.m.data = data
        self.write_data()

    @rule(older=st.booleans())
    def jobs_cleanup(self, older: bool) -> None:
        args = ["--older-than", "0s"] if older else []
        out = run_cli("jobs", "cleanup", *args, "--conn-id", CONN, "-o", "json")
        assert out.returncode == 0, out.stderr[-3000:]
        if older:  # no XCom in Airflow's database holds them (the module's docstring)
            for job in self.m.jobs:
                if job.state != "running":
                    job.gone = job.seen_end = True

    @rule()
    def data_gc(self) -> None:
        out = run_cli("data", "gc", "--older-than", "0s", "--conn-id", CONN, "-o", "json")
        assert out.returncode == 0, out.stderr[-3000:]

    @rule()
    def put_key(self) -> None:
        self.m.key_puts += 1
        src = self.dir / "put"
        src.write_text(f"put-{self.m.key_puts}")
        KeyStore(self.store).put(KEY, src)

    # ---- invariants ------------------------------------------------------------------
    @invariant()
    def ran_as_the_model_says(self) -> None:
        assert self.ran() == self.m.runs, self.runs.read_text() if self.runs.exists() else ""

    @invariant()
    def nothing_held_is_gone(self) -> None:
        for job in self.m.jobs:
            for h in self.entry(job.job_id).get(history.DATA_HASHES) or ():
                assert self.store.exists(marker_key(h)), f"data of {job.job_id} in its entry"
            if job.state == "running":
                assert self.store.exists(f"{job.job_id}/payload.pkl"), job
        state = KeyStore(self.store).state(KEY)
        for v in state.versions if state else ():
            assert self.store.exists(marker_key(v.version)), f"kept version {v.version}"
            assert self.store.list(cache_key(v.version)), f"kept version {v.version}"

    @invariant()
    def history_says_what_happened(self) -> None:
        listed = sorted(p.parent.name for p in (self.root / "history").glob("*/entry.json"))
        assert listed == sorted(j.job_id for j in self.m.jobs)
        for job in self.m.jobs:
            state = self.entry(job.job_id).get("state")
            if job.state == "running":
                assert state not in history.ENDED, (job, state)
            elif job.state == "cancelled":
                assert state == history.CANCELLED, (job, state)
            elif job.superseded_ended and KNOWN_GAP:
                continue  # test_a_superseded_ended_job_says_how_it_ended
            elif job.seen_end or job.delivered:
                assert state == "SUCCEEDED", (job, state)
            else:
                assert state in (history.SUBMITTED, "SUCCEEDED"), (job, state)

    def teardown(self) -> None:
        self.gate.unlink(missing_ok=True)
        cancel_jobs(self.root, release=True)
        sys.modules.pop(self.modname, None)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.timeout(900)
def test_the_model_holds(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_local_conn(monkeypatch, tmp_path / "unset", CONN)  # undone at the end
    profile = os.environ.get("HYPOTHESIS_PROFILE", "kinetic-bounded")
    run_state_machine_as_test(
        lambda: IdentityMachine(tmp_path), settings=settings.get_profile(profile)
    )


#: Sequences the model test may not draw in its bounded run, each through the same
#: machine and invariants: a worker that died with its job running or ended, then what
#: happens before the retry.
SEQUENCES = {
    "adopt": [("dying_try", {"after_end": False}), ("full_try", {"same": False})],
    "collect": [("dying_try", {"after_end": True}), ("full_try", {"same": True})],
    "fixed_code_running": [
        ("dying_try", {"after_end": False}),
        ("change_code", {"version": 2}),
        ("full_try", {"same": False}),
    ],
    "new_data_ended": [
        ("dying_try", {"after_end": True}),
        ("change_data", {"data": 1}),
        ("full_try", {"same": False}),
    ],
    "cancelled": [
        ("dying_try", {"after_end": False}),
        ("cancel", {}),
        ("full_try", {"same": False}),
    ],
    "cleanup_ended": [
        ("dying_try", {"after_end": True}),
        ("jobs_cleanup", {"older": True}),
        ("full_try", {"same": False}),
    ],
    "cleanup_running": [
        ("dying_try", {"after_end": False}),
        ("data_gc", {}),
        ("jobs_cleanup", {"older": True}),
        ("full_try", {"same": False}),
    ],
    "fixed_code_ended": [
        ("dying_try", {"after_end": True}),
        ("change_code", {"version": 2}),
        ("full_try", {"same": False}),
    ],
    "same_code_again": [
        ("dying_try", {"after_end": False}),
        ("change_code", {"version": 1}),
        ("change_data", {"data": 0}),
        ("full_try", {"same": False}),
    ],
    "keys": [("put_key", {})] * 4 + [("full_try", {"same": False}), ("data_gc", {})],
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_a_sequence_holds(
    name: str, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_local_conn(monkeypatch, tmp_path / "unset", CONN)
    machine = IdentityMachine(tmp_path)
    try:
        machine.start()
        for step, args in SEQUENCES[name]:
            getattr(machine, step)(**args)
            machine.ran_as_the_model_says()
            machine.nothing_held_is_gone()
            machine.history_says_what_happened()
    finally:
        machine.teardown()


@pytest.mark.xfail(
    strict=True,
    reason="a superseded job that had ended keeps its history entry SUBMITTED: "
    "TaskTry.look_back retires it without recording its end",
)
def test_a_superseded_ended_job_says_how_it_ended(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The minimal sequence the state machine found: a worker dies after its job
    succeeded; the code changes; the next try runs the new work.  The old job's entry
    must say it ended (SUCCEEDED), not SUBMITTED as if it still ran."""
    set_local_conn(monkeypatch, tmp_path / "unset", CONN)
    machine = IdentityMachine(tmp_path)
    try:
        machine.start()
        machine.dying_try(after_end=True)
        machine.change_code(version=2)
        machine.full_try(same=False)
        old = machine.m.jobs[0]
        assert old.superseded_ended
        assert machine.entry(old.job_id).get("state") == "SUCCEEDED"
    finally:
        machine.teardown()
