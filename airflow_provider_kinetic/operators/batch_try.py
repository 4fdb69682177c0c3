"""One try of a KineticMapOperator task, as one object: ``BatchTry``.

A try is opened once per execution segment (``open`` in ``execute``, ``reopen`` after
a deferral, ``dry`` for ``dry_run``) with what it needs computed once: the
connection's config, the store, the task identity, the deployment secret, and (made
when first needed) the batch's backend.  Its steps are methods: plan, resume or start
the batch, record it, wait for it (``wait_sync`` or ``wait_deferred``, with the polls
and the deferral: ``operators.batch_wait``), finish it.

Every try of the task keeps a record of its batch in the store (``core.jobs.taskrecord``)
with the batch's work digest (function, shared arguments, every input, options).  A
later try resumes the batch only when its own plan is the same work: then only failed
or missing children run again; otherwise (the function was fixed, the inputs changed)
the old batch's running children are cancelled, its record is kept for history and a
new batch starts.  Results reach XCom before the record says "delivered" and before
any artifact is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import finish as batchfinish
from airflow_provider_kinetic.core.batch import launch as batchlaunch
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
from airflow_provider_kinetic.core.jobs.signing import Keyring, ResultAuthError
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    TaskRecord,
    other_work,
    read_record,
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
from airflow_provider_kinetic.exceptions import KineticBatchFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.links import KineticBatchLink, batch_url
from airflow_provider_kinetic.operators import assets, keyio
from airflow_provider_kinetic.operators.batch_wait import BatchWaits
from airflow_provider_kinetic.operators.common import (
    XCOM_OUTPUT_DIR,
    XCOM_OUTPUT_DIRS,
    deadline,
    directory_uri,
    push_value,
    result_ref_uris,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.operators.usage import report_usage


@dataclass
class PlannedBatch:
    """A new batch, validated and packed (``core.batch.plan.plan_batch``), not started:
    its state, the objects to write (key -> bytes) and the local Data to upload."""

    state: BatchState
    objects: dict[str, bytes]
    local: list[Data]


@dataclass
class BatchTry(BatchWaits):
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
            batchlaunch.start_batch(state, planned.objects, planned.local, self.store)
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
        batchlaunch.launch(state, self.config, self.backend, self.store, self.secret)
        batchmanifest.write_manifest(state, self.store)
        save_live(self.store, state, self.secret)
        self.report()
        self.write_record(delivered=True)
        self.push_output_dirs()
        return batchmanifest.batch_handle(state, self.store)

    # ---- before the wait (the waits: operators.batch_wait) ---------------------------
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
