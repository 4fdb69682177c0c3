"""One try of a KineticMapOperator task, as one object: ``BatchTry``.

A try is opened once per execution segment (``open`` in ``execute``, ``reopen`` after
a deferral, ``dry`` for ``dry_run``) with what it needs computed once: the
connection's config, the store, the task identity, the deployment secret, and (made
when first needed) the batch's backend.  Its steps are methods: plan, resume or start
the batch, record it, wait for it (``wait_sync`` or ``wait_deferred``: the polls and
the deferral are functions of the try in ``operators.batch_wait``), finish it
(``operators.batch_finish``).

Every try of the task keeps a record of its batch in the store (``core.jobs.taskrecord``)
with the batch's work digest (function, shared arguments, every input, options).  A
later try resumes the batch only when its own plan is the same work: then only failed
or missing children run again; otherwise (the function was fixed, the inputs changed)
the old batch's running children are cancelled, its record is kept for history and a
new batch starts.

The record says what the try really does: mode SYNC while the worker watches the
batch (a deferrable try's watch before it defers too), DEFERRED only from the moment
it hands the batch to the triggerer (``deferring``); "delivered" once the values are
in XCom (the batch's ended state saved first, its artifacts held:
``core.batch.finish``), "returned" as the try's last step, and only then do the held
artifacts go.  A retry of a delivered batch that was never returned collects the same
values again from that state; of a returned one, it is a clear and starts anew.
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
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.batch.progress import BatchProgress
from airflow_provider_kinetic.core.batch.resume import (
    delivered_state,
    resume_batch,
    save_live,
    save_plan,
)
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import KINETIC_LAYOUT
from airflow_provider_kinetic.core.jobs.retry_on import input_policy
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
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.links import KineticBatchLink, batch_url
from airflow_provider_kinetic.operators import keyio, reuse
from airflow_provider_kinetic.operators.common import (
    XCOM_BATCH,
    XCOM_OUTPUT_DIR,
    XCOM_OUTPUT_DIRS,
    deadline,
    directory_uri,
    restore_xcom_push,
    task_identity,
)


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
    #: The batch's values were delivered by an earlier try that ended before it
    #: returned them: this try collects them again from the batch's ended state.
    collecting: bool = False
    #: ``cache=True``: result URIs its inputs' cache entries hold (``operators.reuse``).
    cached_uris: set[str] = field(default_factory=set)
    line: batchlogs.StatusLine = field(default_factory=batchlogs.StatusLine)
    progress: BatchProgress = field(default_factory=BatchProgress)

    # ---- opening ---------------------------------------------------------------------
    @classmethod
    def open(cls, op: Any, context: Any) -> BatchTry:
        """The try ``execute`` runs: the connection's config and store, the task's
        identity and the deployment secret."""
        restore_xcom_push(op)
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
        policy = input_policy(op.input_retries)
        request = op.build_request(self.identity, self.store.uri, self.context)
        request, inputs = keyio.pin_batch(op, self.context, self.store, request, op.inputs)
        # The image once for every child; built (if missing) only when executing.
        self.image_plan = op.resolve_image(
            request, self.config, self.store, build=self.context is not None
        )
        if op.broadcast is not None:  # the tree reads an entry by prefix, as FUSE does
            self.store.data_layout = KINETIC_LAYOUT
        state, objects, local = plan_batch(
            request,
            inputs,
            op.input_mode,
            self.store,
            config=self.config,
            max_concurrent=op.max_concurrent,
            retries=0 if policy is not None else op.input_retries,
            fail_fast=op.fail_fast,
            group_name=op.group_name or op.task_id,
            tags=[self.identity["dag_id"], self.identity["task_id"]],
            signing_secret=self.secret,
        )
        if policy is not None:  # input_retries per class
            state.retry_on = policy.to_dict()
        if op.broadcast is not None:
            state.template.env.update(databroadcast.window_env(op.broadcast))
        self.state = state
        return PlannedBatch(state, objects, local)

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
            hits = reuse.take_inputs(self, state)  # cache=True: no child for these
            batchlaunch.start_batch(state, planned.objects, planned.local, self.store)
            save_plan(self.store, state, self.secret)
            reuse.note_inputs(self, state, hits)
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
        if record.delivered and record.returned:  # a clear of a finished task
            supersede_record(self.store, self.identity, record, self.secret)
            return None
        changed = other_work(record, work)
        if record.delivered and not changed:  # its try ended before it returned them
            ended = delivered_state(self.store, record.group_id, self.secret)
            if ended is not None:
                log.info(
                    "kinetic: batch %s delivered its values to a try that ended before "
                    "returning them; collecting the same values again",
                    record.group_id,
                )
                self.collecting = True
                return ended
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

    def deferring(self) -> None:
        """The record says DEFERRED from the moment the try hands its batch to the
        triggerer, never before: a try killed while the worker still watches leaves
        running children the next try adopts, not ones it cancels as a cleared
        deferred try's."""
        self.write_record(mode=DEFERRED)

    def write_record(
        self, *, mode: str = SYNC, delivered: bool = False, returned: bool = False
    ) -> None:
        """The task's record of this try's batch (``core.jobs.taskrecord``): how it
        waits now (``mode``), whether its values are in XCom (``delivered``) and
        handed back to Airflow (``returned``)."""
        state = self.batch
        record = TaskRecord(
            kind="batch",
            mode=mode,
            try_number=self.identity.get("try_number"),
            group_id=state.group_id,
            delivered=delivered,
            returned=returned,
            work=state.work,
        )
        write_record(self.store, self.identity, record, self.secret)
        self.record = record

    # ---- submit only ------------------------------------------------------------------
    def submit_only(self) -> dict[str, Any]:
        """Submit now, wait later: the first children start, the state is saved for
        ``KineticBatchSensor`` (which launches the rest), the handle is the value."""
        state = self.batch
        batchlaunch.launch(state, self.config, self.backend, self.store, self.secret)
        batchmanifest.write_manifest(state, self.store)
        save_live(self.store, state, self.secret)
        self.report()
        self.write_record(delivered=True, returned=True)  # the handle is the value
        self.push_output_dirs()
        return batchmanifest.batch_handle(state, self.store)

    # ---- before the wait (the wait: operators.batch_wait; the finish: batch_finish) --
    def publish(self) -> str:
        """Before the wait: the deadline, the record, the output dirs and the batch's
        link in XCom; returns the link's URL."""
        state = self.batch
        state.deadline = deadline(self.context, self.op.execution_timeout)
        self.write_record(delivered=self.collecting)  # collecting: the values are in XCom
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

    def report(self) -> None:
        """The status line and the ``kinetic_batch`` XCom, when a count changed (the
        line also once a minute): not one line and one XCom write per poll."""
        state = self.batch
        c = batchrun.counts(state)
        key = tuple(v for k, v in c.items() if k != "capacity")
        changed = key != self.line.last
        if said := self.progress.poll(state, self.store, changed):
            self.op.log.info("batch %s: %s", state.group_id, said)
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
        value = batchmanifest.batch_status(state, self.store, c)
        self.context["ti"].xcom_push(key=XCOM_BATCH, value=value)


def child_output_dirs(state: BatchState) -> list[str]:
    """Each input's output dir of a batch, in input order, as ``Data`` takes it."""
    return [
        reuse.cached_output_dir(state, i) or directory_uri(state.template.output_uri(i)) or ""
        for i in range(state.total)
    ]
