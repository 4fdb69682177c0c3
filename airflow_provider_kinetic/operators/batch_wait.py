"""Waiting for a map task's batch in the worker: its children launched, polled, retried
and their live logs shown, until every one has ended; or the batch handed to the
triggerer (``KineticBatchTrigger``) and taken back after it.

Functions of the try (``operators.batch_try.BatchTry``), which the operator calls as
the run operator's try calls ``operators.job_wait``: ``wait_sync`` and
``wait_deferred`` step the batch
(``core.batch.launch``), poll it (``core.batch.run.observe``, the children's log lines
through ``core.batch.logs``), keep the status line and the ``kinetic_batch`` XCom
current, and cancel the running children at the task's execution_timeout or on kill.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic.core.batch import finish as batchfinish
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.jobs.taskrecord import DEFERRED, read_record, request_cancel
from airflow_provider_kinetic.core.logat import info_at
from airflow_provider_kinetic.deployment.signing import result_key_for_job
from airflow_provider_kinetic.exceptions import KineticJobCancelled
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.operators import end_task
from airflow_provider_kinetic.operators.batch_try import BatchTry
from airflow_provider_kinetic.operators.common import defer_grace_s, defer_timeout
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


# ---- waiting ---------------------------------------------------------------------
def wait_sync(t: BatchTry) -> None:
    """Launch, watch and retry children here until every one has ended (or the
    task's execution_timeout cancels them)."""
    t.waiting = True
    delays = poll_delays(t.op.poll_interval, t.backend.first_poll_s)
    while not step(t):
        check_deadline(t)
        t.backend.wait(list(t.batch.active.values()), next(delays))
        poll(t)


def wait_deferred(t: BatchTry) -> None:
    """As ``wait_sync``, but hand the batch to the triggerer: on a backend that
    sees a child end cheaply (the local one) keep launching here while children
    end, and defer once none has ended for ``defer_grace_s`` (each deferral costs a
    settle); elsewhere defer after the first launch.  Returns only when every child
    has ended before a deferral."""
    t.waiting = True
    delays = poll_delays(t.op.poll_interval, t.backend.first_poll_s)
    watch = defer_grace_s() if t.backend.first_poll_s is not None else 0.0
    changed = time.monotonic()
    while not step(t):
        check_deadline(t)
        if time.monotonic() - changed >= watch:
            defer(t)
        t.backend.wait(list(t.batch.active.values()), next(delays))
        ended = len(t.batch.done)
        poll(t)
        if len(t.batch.done) != ended:
            changed = time.monotonic()


def step(t: BatchTry) -> bool:
    """Launch what the cap allows, keep the manifest and the status current;
    whether every child has ended."""
    state = t.batch
    batchlaunch.launch(state, t.config, t.backend, t.store, t.secret)
    batchmanifest.maybe_write_manifest(state, t.store)
    t.report()
    return state.finished


def check_deadline(t: BatchTry) -> None:
    """At the task's execution_timeout: cancel the running children and fail."""
    state = t.batch
    if state.deadline and time.time() >= state.deadline:
        cancel(t)
        raise KineticJobCancelled(
            f"kinetic batch {state.group_id} cancelled at the task's execution_timeout"
        )


def defer(t: BatchTry) -> NoReturn:
    """The trigger drives the rest (launches, retries) and fires once at the end;
    ``driver`` names this deferral, so its saves are never mistaken for another's."""
    state = t.batch
    state.driver, state.seq = uuid.uuid4().hex, 0
    t.op.log.info(
        "batch %s: deferring until every child has ended (%d running, %d queued; "
        "the triggerer launches the rest)",
        state.group_id,
        len(state.active),
        len(state.queue),
    )
    t.deferring()  # the record says DEFERRED from here on, not before
    t.op.defer(
        trigger=KineticBatchTrigger(
            state=state.to_dict(),
            config=config_to_json(t.config),
            poll_interval=t.op.poll_interval,
            deadline=state.deadline,
            log_bytes_per_poll=t.op.child_log_bytes_per_poll,
            drive=True,
            end_task=end_task.decide(t.op, t.identity, ordered=t.op.ordered),
        ),
        method_name="execute_complete",
        timeout=defer_timeout(state.deadline, t.op.poll_interval),
    )
    raise AssertionError("defer() returned")  # pragma: no cover - defer always raises


def resumed(t: BatchTry, event: Mapping[str, Any]) -> None:
    """Back from the trigger: the record says SYNC again (the worker watches the
    batch from here), say how it ended (a timeout cancels the running children
    and fails), then re-read the real status of the active children.

    An event of another batch than the one this try's record says it deferred on
    (a cleared try's trigger that outlived the clear under this try's trigger id:
    ``operators.job_wait.resumed``) fails the try, never delivers that batch's
    values: a retry resumes the try's own batch from its record."""
    state, status = t.batch, event["status"]
    record = read_record(t.store, t.identity, t.secret)
    if (
        record is not None
        and record.try_number == t.identity.get("try_number")
        and record.mode == DEFERRED
        and not record.delivered
        and record.group_id not in (None, state.group_id)
    ):
        raise AirflowException(
            f"kinetic: the trigger's event is batch {state.group_id}'s, not this try's "
            f"batch {record.group_id} (an earlier try's trigger, still running after a "
            "clear): its values are not this try's; a retry resumes this try's batch"
        )
    t.write_record()
    if status == "finished":  # driven to its end by the trigger: collect
        t.op.log.info("batch %s: every child has ended; collecting", state.group_id)
    if status in ("error", "timeout"):
        t.op.log.warning("batch trigger ended with %s: %s", status, event.get("message"))
        if status == "timeout":
            cancel(t)
            raise KineticJobCancelled(
                f"kinetic batch {state.group_id} cancelled at the task's execution_timeout"
            )
    poll(t)


def cancel(t: BatchTry) -> None:
    """Cancel every child this try has running (only while it waits on them)."""
    if not t.waiting or t.state is None:
        return
    state = t.state
    for handle in list(state.active.values()):
        request_cancel(t.store, t.backend, handle)
    batchfinish.batch_cancelled(state, t.store, "cancelled")
    t.op.log.info("cancelled %d children of batch %s", len(state.active), state.group_id)


# ---- observing and reporting the batch -------------------------------------------
def poll(t: BatchTry) -> None:
    """Fold the active children's status into the state, their new log lines into
    the task log."""
    state, backend = t.batch, t.backend
    handles = list(state.active.values())
    reports = backend.batch_status(state.group_id, handles) if handles else {}
    # Before observe: it deletes finished children's Jobs (and their pod logs).
    batchlogs.show(
        state,
        backend,
        reports,
        lambda i, line, ns: child_line(t, i, line, ns),
        t.op.child_log_bytes_per_poll,
    )
    auth = state.template.result_auth
    finished = batchrun.observe(
        state,
        reports,
        backend,
        t.store,
        payload_key=lambda child: result_key_for_job(child.job_id, auth),
    )
    batchlogs.log_failures(state, finished, reports, t.op.log)
    batchlogs.forget_finished(state)


def child_line(t: BatchTry, index: int, line: str, ns: int | None = None) -> None:
    """A child's log line, at the time the child wrote it where known."""
    info_at(t.op.log, ns, "[child %d] %s", index, line)
