"""One try of a KineticMapOperator task, as one object: ``BatchTry``.

A try is opened once per execution segment (``open`` in ``execute``, ``reopen`` after
a deferral, ``dry`` for ``dry_run``) with what it needs computed once: the
connection's config, the store, the task identity, the deployment secret, and (made
when first needed) the batch's backend.  Its steps are methods: plan, resume or start
the batch, record it, wait for it (``wait_sync`` or ``wait_deferred``), finish it.

Every try of the task keeps a record of its batch in the store (``core.jobs.taskrecord``)
with the batch's work digest (function, shared arguments, every input, options).  A
later try resumes the batch only when its own plan is the same work: then only failed
or missing children run again; otherwise (the function was fixed, the inputs changed)
the old batch's running children are cancelled, its record is kept for history and a
new batch starts.  Results reach XCom before the record says "delivered" and before
any artifact is deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import finish as batchfinish
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.finish import batch_ended, gather_values
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.resume import resume_batch, save_live, save_plan
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.jobs.signing import Keyring, ResultAuthError
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    TaskRecord,
    other_work,
    read_record,
    request_cancel,
    supersede_record,
    write_record,
)
from airflow_provider_kinetic.core.keys import databroadcast
from airflow_provider_kinetic.core.runtime.images import ImagePlan
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.deployment.signing import (
    deployment_secret,
    result_key,
    result_key_for_job,
)
from airflow_provider_kinetic.exceptions import KineticBatchFailed, KineticJobCancelled
from airflow_provider_kinetic.hooks.kinetic import KineticHook, config_to_json
from airflow_provider_kinetic.links import KineticBatchLink, batch_url
from airflow_provider_kinetic.operators import assets, keyio
from airflow_provider_kinetic.operators.common import (
    XCOM_BATCH,
    XCOM_OUTPUT_DIR,
    XCOM_OUTPUT_DIRS,
    deadline,
    defer_grace_s,
    defer_timeout,
    directory_uri,
    push_value,
    result_ref_uris,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.operators.usage import report_usage
from airflow_provider_kinetic.triggers.batch import KineticBatchTrigger


@dataclass
class PlannedBatch:
    """A new batch, validated and packed (``core.batch.plan.plan_batch``), not started:
    its state, the objects to write (key -> bytes) and the local Data to upload."""

    state: BatchState
    objects: dict[str, bytes]
    local: list[Data]


@dataclass
class BatchTry:
    """What one try of a map task needs, computed once, and the try's steps.

    ``context`` is None only for a dry run (nothing is executed, nothing recorded).
    ``waiting`` says the try watches its batch's running children: ``cancel`` (the
    task's ``on_kill``) stops them only then, never once the batch is being finished
    or after a submit-only try handed it over to a sensor.
    """

    op: Any  # the KineticMapOperator (operators/map.py imports this module)
    context: Any
    hook: KineticHook
    config: KineticConfig
    store: ObjectStore
    identity: dict[str, Any]
    secret: Keyring
    state: BatchState | None = None
    record: TaskRecord | None = None
    image_plan: ImagePlan | None = None
    waiting: bool = False
    line: batchlogs.StatusLine = field(default_factory=batchlogs.StatusLine)

    # ---- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls, op: Any, context: Any) -> BatchTry:
        """The try ``execute`` runs: the connection's config and store, the task's
        identity and the deployment secret."""
        return cls(
            op=op,
            context=context,
            hook=op.hook,
            config=op.hook.get_config(),
            store=op.hook.get_store(),
            identity=task_identity(context),
            secret=deployment_secret(),
        )

    @classmethod
    def reopen(cls, op: Any, context: Any, state: BatchState) -> BatchTry:
        """The try again after a deferral, on the state the trigger carried back: it
        watches that batch's children from here."""
        opened = cls.open(op, context)
        opened.state, opened.waiting = state, True
        return opened

    @classmethod
    def dry(cls, op: Any) -> BatchTry:
        """A try that only plans (``dry_run``): the store without credentials, an
        identity of its own, no context."""
        config = op.hook.get_config()
        return cls(
            op=op,
            context=None,
            hook=op.hook,
            config=config,
            store=config.store(),  # a dry run needs no credentials
            identity={"dag_id": op.dag_id, "task_id": op.task_id, "run_id": "dry_run"},
            secret=deployment_secret(),
        )

    @cached_property
    def backend(self) -> Backend:
        """The batch's backend, made when first needed (after the plan: a batch that
        fails to plan never looks a cluster up)."""
        assert self.state is not None, "the backend of a try with no batch yet"
        return self.hook.get_backend(self.state.backend)

    @property
    def batch(self) -> BatchState:
        """The try's batch (planned, resumed, or carried back by the trigger)."""
        assert self.state is not None, "the try has no batch yet"
        return self.state

    # ---- plan, resume or start -------------------------------------------------------
    def plan(self) -> PlannedBatch:
        """Validate and pack the batch (the same request path as a single job), its
        children's env carrying the broadcast window; the try's state is the planned
        one until ``resume_or_start`` decides."""
        op = self.op
        request = op.build_request(self.identity, self.store.uri, self.context)
        request, inputs = keyio.pin_batch(op, self.context, self.store, request, op.inputs)
        # The image once for every child; built (if missing) only when executing.
        self.image_plan = op.resolve_image(
            request, self.config, self.store, build=self.context is not None
        )
        state, objects, local = plan_batch(
            request,
            inputs,
            op.input_mode,
            self.store,
            config=self.config,
            max_concurrent=op.max_concurrent,
            retries=op.input_retries,
            fail_fast=op.fail_fast,
            group_name=op.group_name or op.task_id,
            tags=[self.identity["dag_id"], self.identity["task_id"]],
            signing_secret=self.secret,
        )
        if op.broadcast is not None:
            state.template.env.update(databroadcast.window_env(op.broadcast))
        self.state = state
        return PlannedBatch(state, objects, local)

    def check_output_dir(self) -> None:
        """With ``output_asset``: the rendered (or default) dir names an asset, checked
        before any job runs."""
        if self.op.output_asset:
            assets.asset_uri(
                self.batch.template.output_dir, f"task {self.op.task_id!r}: output dir"
            )

    def resume_or_start(self, planned: PlannedBatch) -> BatchState:
        """An earlier try's batch of the same work, else the planned one, started."""
        state = self.resume(planned.state.work)
        if state is None:
            state = planned.state
            self.op.log.info(
                "batch %s: %d inputs, max_concurrent=%d",
                state.group_id,
                state.total,
                state.max_concurrent,
            )
            batchrun.start_batch(state, planned.objects, planned.local, self.store)
            save_plan(self.store, state, self.secret)
        elif state.backend != planned.state.backend:
            # An earlier batch of unknown work ran on another backend: its own from now.
            self.__dict__.pop("backend", None)
        self.state = state
        return state

    def resume(self, work: str | None) -> BatchState | None:
        """An earlier try's batch, reattached when it runs the same ``work`` (only failed
        or missing children run again); a batch of other work (the function was fixed,
        the inputs changed) has its running children cancelled and is not resumed."""
        log = self.op.log
        record = self.record = read_record(self.store, self.identity, self.secret)
        if record is None or record.kind != "batch" or not record.group_id:
            return None
        if record.delivered:
            supersede_record(self.store, self.identity, record, self.secret)
            return None
        changed = other_work(record, work)
        try:
            state = resume_batch(
                self.store,
                self.backend,
                self.config,
                record.group_id,
                self.secret,
                result_key,
                cancel_live=changed or record.mode == DEFERRED,
            )
        except (ObjectNotFound, ResultAuthError) as exc:
            log.warning("cannot resume batch %s (%s): starting anew", record.group_id, exc)
            return None
        if changed:
            supersede_record(self.store, self.identity, record, self.secret)
            log.info(
                "kinetic: batch %s of an earlier try ran other work than this try's (its "
                "code, inputs or options changed since): its running children were "
                "cancelled; starting a new batch",
                record.group_id,
            )
            return None
        log.info("kinetic: resuming batch %s of an earlier try (same work)", record.group_id)
        batchfinish.batch_resumed(self.store, record.group_id, self.identity)  # its entry
        return state

    def write_record(self, delivered: bool = False) -> None:
        """The task's record of this try's batch (``core.jobs.taskrecord``)."""
        state = self.batch
        record = TaskRecord(
            kind="batch",
            mode=DEFERRED if self.op.deferrable else SYNC,
            try_number=self.identity.get("try_number"),
            group_id=state.group_id,
            delivered=delivered,
            work=state.work,
        )
        write_record(self.store, self.identity, record, self.secret)

    # ---- submit only ------------------------------------------------------------------
    def submit_only(self) -> dict[str, Any]:
        """Submit now, wait later: the first children start, the state is saved for
        ``KineticBatchSensor`` (which launches the rest), the handle is the value."""
        state = self.batch
        batchrun.launch(state, self.config, self.backend, self.store, self.secret)
        batchmanifest.write_manifest(state, self.store)
        save_live(self.store, state, self.secret)
        self.report()
        self.write_record(delivered=True)
        self.push_output_dirs()
        return batchmanifest.batch_handle(state, self.store)

    # ---- waiting ---------------------------------------------------------------------
    def publish(self) -> str:
        """Before the wait: the deadline, the record, the output dirs and the batch's
        link in XCom; returns the link's URL."""
        state = self.batch
        state.deadline = deadline(self.context, self.op.execution_timeout)
        self.write_record()
        self.push_output_dirs()
        url = batch_url(
            state.backend,
            state.group_id,
            self.config.project or "",
            self.config.cluster or "",
            self.config.namespace,
            self.op.kinetic_conn_id,
        )
        self.context["ti"].xcom_push(key=KineticBatchLink.key, value=url)
        return url

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
        batchrun.launch(state, self.config, self.backend, self.store, self.secret)
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
        """Back from the trigger: say how it ended (a timeout cancels the running
        children and fails), then re-read the real status of the active children."""
        state, status = self.batch, event["status"]
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
        finished = batchrun.observe(state, reports, backend, self.store)
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

    def push_output_dirs(self) -> None:
        """The batch's ``output_dir`` (the parent) and ``kinetic_output_dirs`` (each
        input's own dir, in input order), so a downstream task finds a child's files
        without the function returning its ``KINETIC_OUTPUT_DIR``."""
        ti = self.context["ti"]
        ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(self.batch.template.output_dir))
        ti.xcom_push(key=XCOM_OUTPUT_DIRS, value=child_output_dirs(self.batch))

    # ---- finishing -------------------------------------------------------------------
    def finish(self) -> list[Any]:
        """Every child has ended: deliver the values, then the asset event."""
        capacity = batchrun.counts(self.batch)["capacity"]  # counted before the batch ends
        result = self.deliver()
        self.emit(result, capacity)
        return result

    def deliver(self) -> list[Any]:
        """Gather every child's value (references where XCom cannot hold one), push the
        list to XCom, then mark the record delivered and end the batch (its history
        entry, its artifacts by the cleanup policy: ``core.batch.finish``)."""
        state, store, op = self.batch, self.store, self.op
        gathered = gather_values(
            state,
            store,
            ordered=op.ordered,
            result_key=lambda job: result_key_for_job(job, state.template.result_auth),
            deliver=lambda value, job, blob: xcom_value(value, store, job, blob, op.log),
        )
        self.waiting = False  # nothing is left running to cancel
        values, failures = gathered.values, gathered.failures
        if failures and not op.return_exceptions:
            self.end_batch(set(), delivered=False)
            report_usage(op, self.context, store, [state.group_id])
            raise KineticBatchFailed(
                batchlogs.failure_summary(state, failures),
                group_id=state.group_id,
                failures=failures,
                partial_results=values,
            )
        if failures:  # returned as error values: their errors and log tails still show
            op.log.warning(
                "%s\n(return_exceptions=True: returned as error values in their positions)",
                batchlogs.failure_summary(state, failures),
            )
        result = [
            batchoutcomes.describe_exception(v) if isinstance(v, BaseException) else v
            for v in values
        ]
        push_value(op, self.context, result)  # Airflow has it before anything is deleted
        self.write_record(delivered=True)
        self.end_batch(result_ref_uris(values), delivered=True)
        report_usage(op, self.context, store, [state.group_id])
        return result

    def end_batch(self, kept_uris: set[str], delivered: bool) -> None:
        batch_ended(
            self.batch,
            self.store,
            self.backend,
            delivered=delivered,
            mode=self.op.cleanup,
            kept_uris=kept_uris,
            log_=self.op.log,
        )

    def emit(self, result: Any, capacity: dict[str, int]) -> None:
        """The batch's asset event: its parent output dir (``operators.assets``)."""
        state = self.batch
        out = directory_uri(state.template.output_dir) or state.template.output_dir
        extra = assets.batch_extra(state, result, out, child_output_dirs(state), capacity)
        assets.emit(self.op, self.context, out, extra)


def child_output_dirs(state: BatchState) -> list[str]:
    """Each input's output dir of a batch, in input order, as ``Data`` takes it."""
    return [directory_uri(state.template.output_uri(i)) or "" for i in range(state.total)]
