"""Waiting for a map task's batch in the worker: its children launched, polled, retried
and their live logs shown, until every one has ended; or the batch handed to the
triggerer (``KineticBatchTrigger``) and taken back after it.

A mixin of ``operators.batch_try.BatchTry`` (as ``operators.job_wait`` is the run
operator's wait): ``wait_sync`` and ``wait_deferred`` step the batch
(``core.batch.launch``), poll it (``core.batch.run.observe``, the children's log lines
through ``core.batch.logs``), keep the status line and the ``kinetic_batch`` XCom
current, and cancel the running children at the task's execution_timeout or on kill.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, NoReturn

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import finish as batchfinish
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.jobs.signing import Keyring
from airflow_provider_kinetic.core.jobs.taskrecord import request_cancel
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.signing import result_key_for_job
from airflow_provider_kinetic.exceptions import KineticJobCancelled
from airflow_provider_kinetic.hooks.kinetic import config_to_json
from airflow_provider_kinetic.operators.common import XCOM_BATCH, defer_grace_s, defer_timeout
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


class BatchWaits:
    """The waits of a map task's try (mixed into ``BatchTry``, whose fields these are)."""

    op: Any
    context: Any
    config: KineticConfig
    store: ObjectStore
    secret: Keyring
    state: BatchState | None
    waiting: bool
    line: batchlogs.StatusLine
    backend: Backend  # the try's (made when first needed)
    batch: BatchState  # the try's batch
    # ``BatchTry.deferring`` and ``BatchTry.write_record`` keep the task's record.

    # ---- waiting ---------------------------------------------------------------------
    def wait_sync(self) -> None:
        """Launch, watch and retry children here until every one has ended (or the
        task's execution_timeout cancels them)."""
        self.waiting = True
        delays = poll_delays(self.op.poll_interval, self.backend.first_poll_s)
        while not self.step():
            self.check_deadline()
            self.backend.wait(list(self.batch.active.values()), next(delays))
            self.poll()

    def wait_deferred(self) -> None:
        """As ``wait_sync``, but hand the batch to the triggerer: on a backend that
        sees a child end cheaply (the local one) keep launching here while children
        end, and defer once none has ended for ``defer_grace_s`` (each deferral costs a
        settle); elsewhere defer after the first launch.  Returns only when every child
        has ended before a deferral."""
        self.waiting = True
        delays = poll_delays(self.op.poll_interval, self.backend.first_poll_s)
        watch = defer_grace_s() if self.backend.first_poll_s is not None else 0.0
        changed = time.monotonic()
        while not self.step():
            self.check_deadline()
            if time.monotonic() - changed >= watch:
                self.defer()
            self.backend.wait(list(self.batch.active.values()), next(delays))
            ended = len(self.batch.done)
            self.poll()
            if len(self.batch.done) != ended:
                changed = time.monotonic()

    def step(self) -> bool:
        """Launch what the cap allows, keep the manifest and the status current;
        whether every child has ended."""
        state = self.batch
        batchlaunch.launch(state, self.config, self.backend, self.store, self.secret)
        batchmanifest.maybe_write_manifest(state, self.store)
        self.report()
        return state.finished

    def check_deadline(self) -> None:
        """At the task's execution_timeout: cancel the running children and fail."""
        state = self.batch
        if state.deadline and time.time() >= state.deadline:
            self.cancel()
            raise KineticJobCancelled(
                f"kinetic batch {state.group_id} cancelled at the task's execution_timeout"
            )

    def defer(self) -> NoReturn:
        """The trigger drives the rest (launches, retries) and fires once at the end;
        ``driver`` names this deferral, so its saves are never mistaken for another's."""
        state = self.batch
        state.driver, state.seq = uuid.uuid4().hex, 0
        self.op.log.info(
            "batch %s: deferring until every child has ended (%d running, %d queued; "
            "the triggerer launches the rest)",
            state.group_id,
            len(state.active),
            len(state.queue),
        )
        self.deferring()  # the record says DEFERRED from here on, not before
        self.op.defer(
            trigger=KineticBatchTrigger(
                state=state.to_dict(),
                config=config_to_json(self.config),
                poll_interval=self.op.poll_interval,
                deadline=state.deadline,
                log_bytes_per_poll=self.op.child_log_bytes_per_poll,
                drive=True,
            ),
            method_name="execute_complete",
            timeout=defer_timeout(state.deadline, self.op.poll_interval),
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def resumed(self, event: Mapping[str, Any]) -> None:
        """Back from the trigger: the record says SYNC again (the worker watches the
        batch from here), say how it ended (a timeout cancels the running children
        and fails), then re-read the real status of the active children."""
        state, status = self.batch, event["status"]
        self.write_record()
        if status == "finished":  # driven to its end by the trigger: collect
            self.op.log.info("batch %s: every child has ended; collecting", state.group_id)
        if status in ("error", "timeout"):
            self.op.log.warning("batch trigger ended with %s: %s", status, event.get("message"))
            if status == "timeout":
                self.cancel()
                raise KineticJobCancelled(
                    f"kinetic batch {state.group_id} cancelled at the task's execution_timeout"
                )
        self.poll()

    def cancel(self) -> None:
        """Cancel every child this try has running (only while it waits on them)."""
        if not self.waiting or self.state is None:
            return
        state = self.state
        for handle in list(state.active.values()):
            request_cancel(self.store, self.backend, handle)
        batchfinish.batch_cancelled(state, self.store, "cancelled")
        self.op.log.info("cancelled %d children of batch %s", len(state.active), state.group_id)

    # ---- observing and reporting the batch -------------------------------------------
    def poll(self) -> None:
        """Fold the active children's status into the state, their new log lines into
        the task log."""
        state, backend = self.batch, self.backend
        handles = list(state.active.values())
        reports = backend.batch_status(state.group_id, handles) if handles else {}
        # Before observe: it deletes finished children's Jobs (and their pod logs).
        batchlogs.show(state, backend, reports, self.child_line, self.op.child_log_bytes_per_poll)
        auth = state.template.result_auth
        finished = batchrun.observe(
            state,
            reports,
            backend,
            self.store,
            payload_key=lambda child: result_key_for_job(child.job_id, auth),
        )
        batchlogs.log_failures(state, finished, reports, self.op.log)
        batchlogs.forget_finished(state)

    def child_line(self, index: int, line: str) -> None:
        self.op.log.info("[child %d] %s", index, line)

    def report(self) -> None:
        """The status line and the ``kinetic_batch`` XCom, when a count changed (the
        line also once a minute): not one line and one XCom write per poll."""
        state = self.batch
        c = batchrun.counts(state)
        key = tuple(v for k, v in c.items() if k != "capacity")
        changed = key != self.line.last
        if not self.line.due(key):
            return
        self.op.log.info(
            "batch %s: submitted %d/%d, active %d, succeeded %d, failed %d, queued %d",
            state.group_id,
            c["submitted"],
            c["total"],
            c["active"],
            c["succeeded"],
            c["failed"],
            c["queued"],
        )
        if not changed:
            return
        self.context["ti"].xcom_push(
            key=XCOM_BATCH,
            value={
                "group_id": state.group_id,
                "bucket": self.store.bucket,
                "manifest_uri": self.store.uri(batchmanifest.manifest_key(state.group_id)),
                "output_dir": state.template.output_dir,
                "counts": c,
            },
        )
