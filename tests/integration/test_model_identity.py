"""A model of "the same work" and "still needed" (docs/ARCHITECTURE.md, "Identity and liveness"),
checked against the real thing by a Hypothesis state machine.

One task (``model / manual__m / t``) runs ``KineticRunOperator.execute`` in this process
(a fake task instance, ``tests/fixtures/fake_ti.py``) against a real local store and
backend: every job is a real runner process.  The task's function lives in a module
file the test rewrites (its ``VERSION`` constant: the code) and reads a ``Data`` file
(the input); it appends one line per run to a file and returns ``v{VERSION}:{data}``.

Steps: a try that runs to its end (a retry under the same try number or the next);
a try whose worker dies once its job is submitted (the job held running) or once its
job ended (nothing delivered); a deferrable try whose trigger sees the job end, its
trigger first restarted (cancelled while the job runs, made again from its serialised
kwargs: the same job, the value delivered once) or not, and then either the task
resumes on a worker with the value (the trigger in the deferring process, as in
``dag.test()``) or the trigger ends the task itself (a triggerer's: it finishes the
job and hands the value, ``TaskSuccessEvent``; the XComs it pushes through the Task
SDK go to the fake task instance, as no triggerer's channel is here), that event lost
or not (a trigger of the same try made again once the job is gone hands the record's
value again, never a second run); the running try marked failed by a user, as a worker's task
(``on_kill``) or a deferred one (the trigger's ``on_kill``): its job is cancelled, no
value is delivered, and no later try adopts or collects it; the job cancelled (``jobs
cancel``); its supervisor SIGKILLed alone (the runner must die with it; the job reads
FAILED); a new version of
the code; new bytes in the Data file; ``jobs cleanup`` (the retention form, and
``--older-than 0s``); ``data gc --older-than 0s``; a ``store put`` of a key; time
passing beyond every retention (the retention days set to 0 for ``jobs cleanup`` and
``data gc``: every ended job's history entry and a failed job's artifacts go, a
running job's entry, payload and Data stay).

After every step: (1) every delivered value is the current code's for the current
input (checked as it is delivered), and every value handed to Airflow (a worker's or
a trigger's) is its job's work's, delivered once per job (only a re-created trigger
hands it again: the same value); (2) the function ran exactly as often as the model
says (an unchanged retry adopts or collects the job of its work, never runs it again;
a try after a delivered one, the trigger's too, runs it again: a clear); (3) nothing
a live holder names is gone (the Data of every job in the history, the running job's
artifacts, the retryable job's result until ``jobs cleanup --older-than`` deletes it,
each kept version of the key); (4) every job's history entry says what happened to it;
(5) the task's record says the latest delivered job was delivered and returned, and
holds the XComs a trigger ended the task with (none of a worker's).

What it found: a try of other work that found the earlier try's job *ended* retired
it without writing its end, so that job's history entry stayed SUBMITTED and holds
kept its files as a running job's (``test_a_superseded_ended_job_says_how_it_ended``,
fixed in ``TaskTry.look_back``).

The tries' XComs stay in the fake task instance (not in Airflow's database), so the
holders ``jobs cleanup`` and ``data gc`` read from XComs are absent here: the model
says what that allows (``--older-than 0s`` deletes an ended job's artifacts).

``HYPOTHESIS_PROFILE=kinetic-release`` runs many more and longer sequences
(docs/TESTING.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.stateful import run_state_machine_as_test

from tests.fixtures.identity_model import CONN, IdentityMachine
from tests.fixtures.local_conn import set_local_conn

#: Every job is a real process (about a second), so few, short sequences by default:
#: the same ones each run (``derandomize``), nothing kept between runs (``database``).
settings.register_profile(
    "kinetic-bounded",
    max_examples=12,
    stateful_step_count=16,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
#: Before a release: new sequences each run, many and long (tens of minutes); a
#: failure prints the blob that reproduces it (``@reproduce_failure``).
settings.register_profile(
    "kinetic-release",
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "kinetic-bounded")


def prepare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The machine's conn (the machine sets it; undone at the end) and deferrable
    tries that defer at once (their jobs are held running)."""
    set_local_conn(monkeypatch, tmp_path / "unset", CONN)
    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")


@pytest.mark.timeout(900 if PROFILE == "kinetic-bounded" else 0)
def test_the_model_holds(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(monkeypatch, tmp_path)
    set_hypothesis_home_dir(tmp_path / "hypothesis")  # its caches: not in the checkout
    try:
        run_state_machine_as_test(
            lambda: IdentityMachine(tmp_path), settings=settings.get_profile(PROFILE)
        )
    finally:
        set_hypothesis_home_dir(None)


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
    "marked_failed": [
        ("mark_failed", {"deferred": False}),
        ("full_try", {"same": False}),
    ],
    "marked_failed_deferred": [
        ("dying_try", {"after_end": False}),
        ("mark_failed", {"deferred": True}),
        ("deferred_try", {"restart": False, "end": "trigger"}),
    ],
    "trigger_restart": [
        ("deferred_try", {"restart": True, "end": "lost"}),
        ("change_code", {"version": 2}),
        ("deferred_try", {"restart": True}),
        ("full_try", {"same": False}),
    ],
    "trigger_ends": [
        ("dying_try", {"after_end": False}),
        ("deferred_try", {"restart": False, "end": "trigger"}),
        ("jobs_cleanup", {"older": True}),
        ("full_try", {"same": True}),
    ],
    "retention": [
        ("dying_try", {"after_end": False}),
        ("kill_supervisor", {}),
        ("full_try", {"same": False}),
        ("dying_try", {"after_end": False}),
        ("retention_passes", {}),
        ("full_try", {"same": False}),
        ("retention_passes", {}),
    ],
    "supervisor_killed": [
        ("dying_try", {"after_end": False}),
        ("kill_supervisor", {}),
        ("full_try", {"same": False}),
    ],
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_a_sequence_holds(
    name: str, airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(monkeypatch, tmp_path)
    machine = IdentityMachine(tmp_path)
    try:
        machine.start()
        for step, args in SEQUENCES[name]:
            getattr(machine, step)(**args)
            machine.check()
    finally:
        machine.teardown()


def test_a_superseded_ended_job_says_how_it_ended(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The minimal sequence the state machine found: a worker dies after its job
    succeeded; the code changes; the next try runs the new work.  The old job's entry
    must say it ended (SUCCEEDED), not SUBMITTED as if it still ran."""
    prepare(monkeypatch, tmp_path)
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
