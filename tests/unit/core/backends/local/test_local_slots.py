"""The machine-wide job slots and their queue (``slot_queue``, ``local/slots.py``): real
``flock``s and files in a temp dir, real processes where one must die; the limit's
value from the Airflow option, the env and the CPU count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local import slot_queue
from airflow_provider_kinetic.core.backends.local import slots as local_slots
from airflow_provider_kinetic.core.backends.local.slot_queue import SLOT_FILE, WAIT_FILE
from airflow_provider_kinetic.core.backends.local.slots import (
    MAX_JOBS_ENV,
    SLOTS_ENV,
    LocalMaxJobsError,
    resolve_max_jobs,
)
from airflow_provider_kinetic.core.spec.handles import JobStatus


@pytest.fixture
def slots(tmp_path: Path, monkeypatch) -> Iterator[str]:
    where = str(tmp_path / "slots")
    monkeypatch.setenv(SLOTS_ENV, where)
    slot_queue.make_dir(where)
    yield where
    for fd in _TICKETS:  # the backend-side tickets' locks, held by the test
        os.close(fd)
    _TICKETS.clear()


_TICKETS: list[int] = []


def ticket(slots: str) -> tuple[str, int]:
    name = slot_queue.ticket_name()
    return name, slot_queue.open_ticket(slots, name, "job dir")


# ---- the limit's value --------------------------------------------------------------


def test_the_limit_comes_from_the_option_then_the_env_then_the_cpus(monkeypatch) -> None:
    monkeypatch.setenv(MAX_JOBS_ENV, "5")
    assert resolve_max_jobs(3) == 3 and resolve_max_jobs("7") == 7
    assert resolve_max_jobs(None) == 5 and resolve_max_jobs("") == 5
    monkeypatch.delenv(MAX_JOBS_ENV)
    assert resolve_max_jobs() == local_slots.machine_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", [0, -1, "two", "1.5", " "])
def test_a_limit_below_one_or_not_whole_is_an_error(bad, monkeypatch) -> None:
    with pytest.raises(LocalMaxJobsError, match="local_max_jobs must be a whole number"):
        resolve_max_jobs(bad)
    monkeypatch.setenv(MAX_JOBS_ENV, "0")
    with pytest.raises(LocalMaxJobsError, match=MAX_JOBS_ENV):
        resolve_max_jobs()


def test_the_airflow_option_reaches_the_local_backend(tmp_path, monkeypatch) -> None:
    from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
    from airflow_provider_kinetic.deployment.backends import backend_for

    config = KineticConfig(backend="local", root=str(tmp_path))
    monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_MAX_JOBS", "3")
    assert backend_for(config).max_jobs == 3
    monkeypatch.delenv("AIRFLOW__KINETIC__LOCAL_MAX_JOBS")
    monkeypatch.setenv(MAX_JOBS_ENV, "9")  # unset in Airflow: the env, else the CPUs
    assert backend_for(config).max_jobs == 9
    monkeypatch.setenv("AIRFLOW__KINETIC__LOCAL_MAX_JOBS", "none")
    with pytest.raises(KineticConfigError, match=r"\[kinetic\] local_max_jobs"):
        backend_for(config)


# ---- tickets -----------------------------------------------------------------------


def test_tickets_sort_in_creation_order_and_live_while_their_lock_is_held(slots) -> None:
    made = [ticket(slots) for _ in range(5)]
    assert slot_queue.waiting(slots) == [name for name, _ in made]
    queue = os.path.join(slots, slot_queue.QUEUE_DIR)
    assert all(slot_queue.is_live(os.path.join(queue, name)) for name, _ in made)
    os.close(made[2][1])  # its holder died
    assert not slot_queue.is_live(os.path.join(queue, made[2][0]))
    assert not slot_queue.is_live(os.path.join(queue, "no-such-ticket"))
    for _, fd in made[:2] + made[3:]:
        os.close(fd)


def test_a_ticket_is_never_seen_unlocked(slots) -> None:
    """Made under a dot name and renamed once locked: the listing skips dot names."""
    queue = Path(slots, slot_queue.QUEUE_DIR)
    (queue / ".half-made").touch()
    assert slot_queue.waiting(slots) == []


# ---- taking slots in order ---------------------------------------------------------


def test_fifo_a_later_ticket_never_takes_the_slot_an_earlier_one_is_due(slots) -> None:
    (a, fa), (b, fb), (c, fc) = ticket(slots), ticket(slots), ticket(slots)
    busy = slot_queue.try_take(slots, 2, a)[0]  # a takes one of two slots
    assert busy is not None
    slot_queue.remove(slots, a)
    # One slot free: b is at the front, c behind it must wait.
    assert slot_queue.try_take(slots, 2, c) == (None, 1)
    got, _ = slot_queue.try_take(slots, 2, b)
    assert got is not None
    slot_queue.remove(slots, b)
    assert slot_queue.try_take(slots, 2, c) == (None, 0)  # both slots held now
    os.close(busy[1])  # a's job ended: the kernel frees its slot
    assert slot_queue.try_take(slots, 2, c)[0] is not None
    for fd in (fa, fb, fc):
        os.close(fd)


def test_several_free_slots_serve_as_many_tickets_in_any_scan_order(slots) -> None:
    tickets = [ticket(slots) for _ in range(3)]
    got = [slot_queue.try_take(slots, 3, name)[0] for name, _ in reversed(tickets)]
    assert all(g is not None for g in got)
    assert sorted(index for index, _ in got) == [0, 1, 2]
    for index_fd in got:
        os.close(index_fd[1])
    for _, fd in tickets:
        os.close(fd)


def test_a_dead_ticket_ahead_is_removed_and_never_blocks(slots) -> None:
    (dead, fd_dead), (mine, fd_mine) = ticket(slots), ticket(slots)
    os.close(fd_dead)  # a supervisor SIGKILLed while queued leaves its file behind
    got, _ = slot_queue.try_take(slots, 1, mine)
    assert got is not None and dead not in slot_queue.waiting(slots)
    os.close(got[1])
    os.close(fd_mine)


def test_a_slot_held_by_a_killed_process_is_free_again(slots) -> None:
    code = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, os.path.join(slots, "slot-0.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        name, fd = ticket(slots)
        assert slot_queue.try_take(slots, 1, name) == (None, 0)
        holder.send_signal(signal.SIGKILL)
        holder.wait(120)
        got, _ = slot_queue.try_take(slots, 1, name)
        assert got is not None and got[0] == 0
        os.close(got[1])
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()


def test_must_wait_takes_nothing(slots) -> None:
    (a, fa), (b, fb) = ticket(slots), ticket(slots)
    assert not slot_queue.must_wait(slots, 2, b)  # a and b both fit
    assert slot_queue.must_wait(slots, 1, b)  # a is due the only slot
    assert slot_queue.try_take(slots, 1, a)[0] is not None  # must_wait held none
    for fd in (fa, fb):
        os.close(fd)


def test_acquire_says_how_many_are_ahead_whenever_it_changes(slots) -> None:
    (a, fa), (b, fb) = ticket(slots), ticket(slots)
    held = slot_queue.try_take(slots, 1, a)[0]  # a runs; b waits behind nobody
    slot_queue.remove(slots, a)
    said: list[int] = []

    def on_wait(ahead: int) -> None:
        said.append(ahead)
        os.close(held[1])  # the running job ends while b waits

    index, fd = slot_queue.acquire(slots, 1, b, on_wait)
    assert index == 0 and said == [0]
    os.close(fd)
    for fd in (fa, fb):
        os.close(fd)


# ---- the backend's side: status messages, one listing per batch ----------------------


def queued_job(tmp_path: Path, slots: str, limit: int) -> str:
    jdir = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}"
    jdir.mkdir()
    _TICKETS.append(local_slots.take_ticket(str(jdir), limit))  # held: the ticket lives
    (jdir / WAIT_FILE).touch()
    return str(jdir)


def test_status_message_counts_the_tickets_ahead(tmp_path, slots) -> None:
    jdirs = [queued_job(tmp_path, slots, 2) for _ in range(3)]
    messages = [local_slots.queued_report(j) for j in jdirs]
    assert [m.status for m in messages] == [JobStatus.PENDING] * 3
    held = "slots held by 2 jobs elsewhere"  # no job of this dir holds one
    assert [m.message for m in messages] == [
        f"queued: 0 jobs ahead (local_max_jobs=2); position 1 of 3; {held}",
        f"queued: 1 job ahead (local_max_jobs=2); position 2 of 3; {held}",
        f"queued: 2 jobs ahead (local_max_jobs=2); position 3 of 3; {held}",
    ]
    assert messages[2].describe().startswith("PENDING: queued: 2 jobs ahead (local_max_jobs=2)")
    Path(jdirs[0], SLOT_FILE).write_text("0")  # it got its slot: running, and holds one
    assert local_slots.queued_report(jdirs[0]) is None
    assert local_slots.queued_report(jdirs[2]).message.endswith(
        "slots held by job-0 and 1 job elsewhere"
    )
    Path(jdirs[0], "exit_code").write_text("0")  # it ended: holds none
    assert local_slots.queued_report(jdirs[2]).message.endswith(held)


def test_a_batch_lists_the_queue_once_for_all_its_children(tmp_path, slots, monkeypatch) -> None:
    jdirs = [queued_job(tmp_path, slots, 1) for _ in range(20)]
    listed: list[str] = []
    real = slot_queue.waiting
    monkeypatch.setattr(slot_queue, "waiting", lambda d: listed.append(d) or real(d))
    listings: dict[str, list[str]] = {}
    reports = [local_slots.queued_report(j, listings) for j in jdirs]
    assert listed == [slots]
    assert reports[-1].message == (
        "queued: 19 jobs ahead (local_max_jobs=1); position 20 of 20; slot held by 1 job elsewhere"
    )


def test_a_job_without_a_slot_request_or_not_yet_waiting_is_not_queued(tmp_path, slots) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert local_slots.queued_report(str(plain)) is None  # a GPU job, or one from before
    starting = tmp_path / "starting"
    starting.mkdir()
    _TICKETS.append(local_slots.take_ticket(str(starting), 4))  # a slot free: no wait file
    assert not (starting / WAIT_FILE).exists()
    assert local_slots.queued_report(str(starting)) is None


def test_withdraw_takes_the_ticket_out_of_the_queue(tmp_path, slots) -> None:
    jdir = queued_job(tmp_path, slots, 1)
    assert len(slot_queue.waiting(slots)) == 1
    local_slots.withdraw(jdir)
    assert slot_queue.waiting(slots) == []
