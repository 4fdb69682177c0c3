"""One try of a ``KineticRunOperator`` task: what it works with, and its steps.

``TaskTry.open`` is called once per execution segment: in ``execute``, and again in
``execute_complete`` after a deferral.  It takes the connection's config, store and
backend, the task's identity, the deployment secret, and the task's record (read
once: the try keeps it current as it writes it).  Its methods are the try's steps:

* ``plan``, ``look_back``: this try's job, and what an earlier try's job means for it
  (``core.jobs.taskrecord``: adopt it, collect it, or submit anew);
* ``start``, ``submit``, ``publish``: the job recorded before it is created, its XComs;
* ``wait``: polling in the worker with the job's log shown live, following the jobs
  that take over from an ended one (``next_job``: capacity steps, preemption
  re-submits);
* ``finish``: ``core.jobs.finish`` (the same as the job sensor's), then what needs
  Airflow: the task's usage, its output key and asset event;
* ``write_record``: the task's record.

Every try keeps a record of its job in the store (Airflow 3.3's task state store as
a fallback), written *before* the job is created, so a later try finds the job
instead of running it twice.  The record also counts the task's preemption
re-submits (``preemption_retries``), which do not use the task's Airflow ``retries``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.backends.k8s.status import REASON_NOT_ADMITTED
from airflow_provider_kinetic.core.catalog.capacity import chain_for, parse_capacity
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.cleanup import after_job
from airflow_provider_kinetic.core.jobs.fallback import describe_step, next_step
from airflow_provider_kinetic.core.jobs.finish import finish_job
from airflow_provider_kinetic.core.jobs.polling import StoreOutage, poll_delays
from airflow_provider_kinetic.core.jobs.results import is_preemption
from airflow_provider_kinetic.core.jobs.submit import PlannedJob, plan_job, submit_planned
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    Step,
    TaskRecord,
    decide_job,
    read_record,
    record_key,
    request_cancel,
    supersede_record,
    write_record,
)
from airflow_provider_kinetic.core.jobs.usage import note_admitted
from airflow_provider_kinetic.core.spec.handles import (
    JobHandle,
    JobStatus,
    StatusReport,
    new_job_id,
)
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.deployment.connection import store_outage_window_s
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.exceptions import KineticJobCancelled, KineticJobFailed
from airflow_provider_kinetic.links import job_links
from airflow_provider_kinetic.operators import assets, keyio
from airflow_provider_kinetic.operators.capacity import request_fields as capacity_fields
from airflow_provider_kinetic.operators.common import (
    XCOM_JOB,
    XCOM_OUTPUT_DIR,
    KineticOperatorBase,
    directory_uri,
    push_value,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.operators.usage import report_usage


@dataclass
class Earlier:
    """What an earlier try's job means for this try (``decide_job``): submit anew,
    adopt ``job`` (still running) or collect it (finished); ``report``: its status."""

    step: Step
    job: JobHandle | None
    report: StatusReport | None


@dataclass
class Watched:
    """Where a wait ended: on ``handle`` (a later capacity step's job, or a re-submit,
    when the first one was taken over), with its final ``report`` (None: the wait gave
    up and the task defers), its log shown up to ``offset``."""

    handle: JobHandle
    report: StatusReport | None
    offset: int


@dataclass
class StoredRecord:
    """The task's record as stored (its sealed bytes), its task state store entry and
    the record the try held: what a rejected submit puts back."""

    sealed: bytes | None
    state_entry: Any
    record: TaskRecord | None


def preemptions_of(record: TaskRecord | None) -> int:
    return record.preemptions if record is not None and record.kind == "job" else 0


@dataclass
class TaskTry:
    """One execution segment of a KineticRunOperator try (see the module)."""

    #: The KineticRunOperator (its options and its log).
    op: KineticOperatorBase
    context: Any
    config: KineticConfig
    store: ObjectStore
    backend: Backend
    identity: dict[str, Any]
    secret: bytes
    #: The task's record: read once at ``open`` (the task state store's entry when
    #: the store has none), then what this try last wrote.
    record: TaskRecord | None
    #: This try's work digest (``plan``); None until planned (a resumed segment has
    #: not planned: the record's then).
    work: str | None = None
    #: The job this try waits for (``on_kill`` cancels it); None once it is finished,
    #: or when nobody waits for it.
    handle: JobHandle | None = None

    @classmethod
    def open(cls, op: Any, context: Any, backend_kind: str | None = None) -> TaskTry:
        """The try's config, store, backend (``backend_kind``, else the one the
        operator's accelerator runs on), identity, secret and record."""
        config = op.hook.get_config()
        store = op.hook.get_store()
        backend = op.hook.get_backend(backend_kind or config.backend_kind(op.accelerator_spec()))
        identity = task_identity(context)
        secret = deployment_secret()
        record = read_record(store, identity, secret)
        if record is None:
            record = _state_store_record(context)
        return cls(op, context, config, store, backend, identity, secret, record)

    @property
    def log(self) -> Any:
        return self.op.log

    # ---- planning, and what an earlier try left ---------------------------------------
    def plan(self, step: int = 0) -> PlannedJob:
        """This try's job (for capacity step ``step``), validated and packed under a new
        id; nothing uploaded or built.  Its work digest is what an earlier try's job is
        compared with."""
        request = self.op.build_request(self.identity, self.store.uri, self.context)
        request, _, pins = keyio.pin_request(self.op, self.context, self.store, request)
        self.op.resolve_image(request, self.config, self.store, build=False)
        planned = plan_job(request, self.config, self.store, new_job_id(), self.secret, step)
        self.work = planned.work
        return keyio.with_pins(planned, pins)

    def look_back(self, planned: PlannedJob) -> Earlier:
        """What the task's record says of an earlier try's job.  One this try will not
        use (it ended, was cancelled, or ran other work) keeps its record under
        ``superseded/`` and gets the failure rule of the cleanup policy."""
        record = self.record
        step, old, report, why = decide_job(
            record, self.backend, self.store, result_key, planned.work
        )
        if record is not None:
            self.log.info("kinetic: earlier try found: %s -> %s", why, step.value)
            if step is Step.SUBMIT and old is not None:  # keep the old record for history
                supersede_record(self.store, self.identity, record, self.secret)
                # Cancelled or ended, and never collected: the failure rule of the policy.
                after_job(
                    self.store,
                    self.backend,
                    [old],
                    succeeded=False,
                    mode=self.op.cleanup,
                    log_=self.log,
                )
        return Earlier(step, old, report)

    # ---- submitting, adopting, publishing ----------------------------------------------
    def start(self, earlier: Earlier, planned: PlannedJob) -> JobHandle:
        """The job this try waits for: the earlier try's, adopted, or ``planned``
        submitted; recorded and published."""
        if earlier.step is Step.ADOPT:
            assert earlier.job is not None and earlier.report is not None
            status = earlier.report.status.value
            self.log.info("adopting still-%s kinetic job %s", status, earlier.job.job_id)
            handle = earlier.job
        else:
            handle = self.submit(planned)
        self.write_record(handle)
        self.publish(handle)
        return handle

    def submit_only(self, earlier: Earlier, planned: PlannedJob) -> dict[str, Any]:
        """Submit now, wait later: the handle is the task's value.  A retry after a
        worker died returns the job it had submitted; a clear submits a new one."""
        handle = earlier.job if earlier.step is not Step.SUBMIT else None
        if handle is None:
            handle = self.submit(planned)
        self.publish(handle)
        self.write_record(handle, delivered=True)
        self.handle = None  # nobody waits here: on_kill must not cancel it
        return handle.to_dict()

    def submit(self, planned: PlannedJob | None = None) -> JobHandle:
        """Submit a planned job (a new plan when none is given), recording its id
        *before* it is created: a worker that dies in between leaves a record a retry
        can follow (and never a second job).  A missing bundled image is built first.
        A submit that is rejected (an upload, a requirements venv, the create call) and
        leaves no job puts the task's record back as it was: no record names a job
        that was never submitted, so the next try is the try it would have been."""
        planned = planned or self.plan()
        if planned.image is not None:
            # Cloud Build and Artifact Registry clients: imported only to submit.
            from airflow_provider_kinetic.gcp.image_build import prepare_image

            prepare_image(planned.image, self.config, self.store)  # before any upload
            self.log.info("kinetic: %s", planned.image.describe())
        job_id = planned.spec.job_id
        provisional = JobHandle(
            job_id=job_id,
            backend=self.backend.name,
            bucket_name=self.store.bucket,
            namespace=self.config.namespace,
            k8s_name=self.backend.object_name(job_id),
        )
        before = self._stored_record()
        self.write_record(provisional)
        try:
            submit_planned(planned, self.backend, self.store)
        except Exception:
            if not self._job_exists(planned.handle):
                self._restore_record(before)
            raise
        return planned.handle

    def _job_exists(self, handle: JobHandle) -> bool:
        """Whether a job whose submit raised exists after all (unknown counts as yes:
        then its record stays, so no later try runs it a second time)."""
        try:
            return self.backend.exists(handle)
        except Exception as exc:  # noqa: BLE001 - cannot tell: keep the record
            self.log.warning("cannot tell whether job %s exists: %s", handle.job_id, exc)
            return True

    def _stored_record(self) -> StoredRecord:
        try:
            sealed: bytes | None = self.store.read_bytes(record_key(self.identity))
        except ObjectNotFound:
            sealed = None
        state = self.context.get("task_state_store")
        try:
            previous = state.get(XCOM_JOB) if state is not None else None
        except Exception:  # noqa: BLE001 - an unreadable state store holds nothing of ours
            previous = None
        return StoredRecord(sealed, previous, self.record)

    def _restore_record(self, before: StoredRecord) -> None:
        """Put back what ``_stored_record`` saw (nothing: no record at all)."""
        key = record_key(self.identity)
        if before.sealed is None:
            self.store.delete(key)
        else:
            self.store.write_bytes(key, before.sealed, content_type="application/json")
        self.record = before.record
        state = self.context.get("task_state_store")
        try:
            if state is not None and before.state_entry is not None:
                state.set(XCOM_JOB, before.state_entry)
            elif state is not None:
                state.delete(XCOM_JOB)
        except Exception as exc:  # noqa: BLE001 - the store record is what counts
            self.log.warning("could not reset the task state store: %s", exc)
        self.log.info("kinetic: the submit was rejected; the task's record is as it was")

    def publish(self, handle: JobHandle) -> None:
        """XComs a person or a downstream task needs while the job runs."""
        self.handle = handle
        ti = self.context["ti"]
        ti.xcom_push(key=XCOM_JOB, value=handle.to_dict())
        ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(handle.output_dir))
        keyio.push_pins(self.context, handle)
        self.op.published_links = job_links(handle, self.op.kinetic_conn_id)
        for key, url in self.op.published_links.items():
            ti.xcom_push(key=key, value=url)
        self.log.info("kinetic job %s: output dir %s", handle.job_id, handle.output_dir)
        if handle.capacity:
            what = parse_capacity(handle.capacity).describe
            self.log.info("kinetic job %s asks for capacity: %s", handle.job_id, what)

    # ---- waiting in the worker ---------------------------------------------------------
    def wait(
        self, handle: JobHandle, deadline: float | None, give_up_after: float | None = None
    ) -> Watched:
        """Poll until the job ends and no job takes over from it (``next_job``), or,
        with ``give_up_after`` (seconds, from each job's start of the wait), until then."""
        while True:
            give_up = None if give_up_after is None else time.monotonic() + give_up_after
            report, offset = self.poll(handle, deadline, give_up)
            if report is None:
                return Watched(handle, None, offset)
            new = self.next_job(handle, report)
            if new is None:
                return Watched(handle, report, offset)
            handle = new

    def poll(
        self, handle: JobHandle, deadline: float | None, give_up: float | None = None
    ) -> tuple[StatusReport | None, int]:
        """Poll until the job ends (its report) or, with ``give_up`` (a monotonic
        time), until then (``None``: the caller defers); the log offset shown so far."""
        offset, last, admitting = 0, None, False
        delays = poll_delays(self.op.poll_interval, self.backend.first_poll_s)
        outage = StoreOutage(store_outage_window_s())
        while True:
            try:
                report = self.backend.status(handle)
            except OSError as exc:  # the store cannot be read: no answer about the job
                delay = outage.failed(exc)  # re-raised once the window has passed
                self.log.warning("kinetic job %s: %s", handle.job_id, outage.describe(exc, delay))
                time.sleep(delay)
                continue
            outage.recovered()
            offset = self.show_logs(handle, offset)
            if report.describe() != last:
                self.log.info("kinetic job %s: %s", handle.job_id, report.describe())
                if admitting and report.reason != REASON_NOT_ADMITTED:  # Kueue let it in
                    note_admitted(self.store, handle.job_id, time.time())
                admitting = report.reason == REASON_NOT_ADMITTED
                last = report.describe()
                if report.status is JobStatus.RUNNING:
                    history.update(self.store, handle.job_id, report.status.value, report.reason)
            if report.status.is_terminal:
                return report, offset
            if give_up is not None and time.monotonic() >= give_up:
                return None, offset
            if deadline is not None and time.time() >= deadline:
                request_cancel(self.store, self.backend, handle)
                raise KineticJobCancelled(
                    f"kinetic job {handle.job_id} cancelled at the task's execution_timeout",
                    job_id=handle.job_id,
                )
            delay = next(delays)
            if give_up is not None:
                delay = max(0.0, min(delay, give_up - time.monotonic()))
            self.backend.wait([handle], delay)

    def show_logs(self, handle: JobHandle, offset: int) -> int:
        text, new_offset = self.backend.read_logs(handle, offset)
        for line in text.splitlines():
            self.log.info("[%s] %s", handle.job_id, line)
        return new_offset

    # ---- jobs that take over from an ended one -----------------------------------------
    def next_job(self, handle: JobHandle, report: StatusReport) -> JobHandle | None:
        """The job that takes over from ``handle``, which ended with ``report``: the
        next capacity step's, or a preempted job's re-submit; None: finish this one."""
        new = self.next_capacity(handle, report)
        if new is None and self.preempted(handle, report):
            new = self.resubmit_preempted(handle, report)
        return new

    def capacity_chain(self) -> list[str]:
        """The task's capacity steps as rendered (the connection's default when the
        task names none): the same chain the task's jobs were planned with."""
        op = self.op
        fields = capacity_fields(
            op.capacity, op.capacity_wait, op.priority_class, op.max_run_duration
        )
        chain = chain_for(fields["capacity"], op.accelerator_spec(), self.config.capacity)
        return [str(step) for step in chain]

    def next_capacity(self, handle: JobHandle, report: StatusReport) -> JobHandle | None:
        """The job of the next capacity step, when ``handle``'s step found no capacity
        and nothing of it ever started (``core.jobs.fallback``); None otherwise."""
        chain = self.capacity_chain()
        step = next_step(chain, handle, report, self.store)
        if step is None:
            return None
        self.log.warning(
            "kinetic job %s: giving up %s: %s; trying %s",
            handle.job_id,
            describe_step(chain, step - 1),
            report.message,
            describe_step(chain, step),
        )
        history.update(
            self.store, handle.job_id, history.CANCELLED, f"{report.reason}: {report.message}"
        )
        self.backend.cancel(handle)  # delete the Job that never ran (its pods never started)
        after_job(
            self.store,
            self.backend,
            [handle],
            succeeded=False,
            mode=self.op.cleanup,
            log_=self.log,
        )
        new = self.submit(self.plan(step))
        self.write_record(new)
        self.publish(new)
        return new

    def preempted(self, handle: JobHandle, report: StatusReport) -> bool:
        """A platform kill (spot reclaim, eviction) with budget left for this task."""
        if not is_preemption(report, self.store, handle):
            return False
        if preemptions_of(self.record) >= self.op.preemption_retries:
            self.log.warning(
                "kinetic job %s was preempted (%s) and the task's %d preemption retries are "
                "used up",
                handle.job_id,
                report.describe(),
                self.op.preemption_retries,
            )
            return False
        return True

    def resubmit_preempted(self, handle: JobHandle, report: StatusReport) -> JobHandle:
        used = preemptions_of(self.record)
        self.log.warning(
            "kinetic job %s was preempted (%s): submitting it again (preemption retry %d/%d; "
            "the task's Airflow retries are not used)",
            handle.job_id,
            report.describe(),
            used + 1,
            self.op.preemption_retries,
        )
        history.update(self.store, handle.job_id, "PREEMPTED", report.reason)
        after_job(
            self.store,
            self.backend,
            [handle],
            succeeded=False,
            mode=self.op.cleanup,
            log_=self.log,
            archive_logs=True,
        )
        self.backend.cancel(handle)  # delete what is left of it
        new = self.submit()
        self.write_record(new, preemptions=used + 1)
        self.publish(new)
        return new

    # ---- finishing ---------------------------------------------------------------------
    def finish(self, handle: JobHandle, report: StatusReport, offset: int) -> Any:
        """The rest of the job's log, then ``core.jobs.finish`` (its value to XCom and
        the record "delivered" before anything is deleted), the task's usage; on
        success its output key and the output dir's asset event.  On every path that
        delivers a value (this worker, a resumed deferral, a later try)."""
        self.show_logs(handle, offset)
        self.log.info("kinetic job %s finished: %s", handle.job_id, report.describe())
        self.handle = None  # done: on_kill must not touch a finished job
        done = finish_job(
            self.store,
            self.backend,
            handle,
            report,
            mode=self.op.cleanup,
            result_key=result_key(handle),
            deliver=lambda value, blob: self.deliver(handle, value, blob),
            checkpoints_of=self.identity,
            log_=self.log,
        )
        self.report_usage(handle)
        if done.error is not None:
            raise KineticJobFailed(
                f"kinetic job {handle.job_id} failed: {done.failure}", job_id=handle.job_id
            ) from done.error
        keyio.put_output_key(self.op, self.context, self.store, handle)
        if handle.output_dir:
            out = directory_uri(handle.output_dir) or handle.output_dir
            assets.emit(self.op, self.context, out, assets.job_extra(handle, done.value, out))
        return done.value

    def deliver(self, handle: JobHandle, value: Any, blob: bytes) -> Any:
        """The value as XCom holds it (a reference when it does not fit), pushed now,
        and the record "delivered": Airflow has it before anything is deleted."""
        multiple = bool(getattr(self.op, "multiple_outputs", False))
        delivered = xcom_value(value, self.store, handle.job_id, blob, self.log, multiple)
        push_value(self.op, self.context, delivered)
        self.write_record(handle, delivered=True)
        return delivered

    def report_usage(self, handle: JobHandle) -> None:
        """The task's usage over every job its run had (the record's attempts)."""
        record = self.record
        attempts = record.attempts if record is not None and record.attempts else []
        report_usage(self.op, self.context, self.store, attempts or [handle.job_id])

    # ---- the task's record -------------------------------------------------------------
    def write_record(
        self, handle: JobHandle, *, delivered: bool = False, preemptions: int | None = None
    ) -> None:
        """The task's record: this try's job, how it waits, its work digest (this try's,
        else the record's: a resumed deferred try has not planned)."""
        old = self.record
        if preemptions is None:
            preemptions = preemptions_of(old)
        work = self.work
        if work is None and old is not None and old.job and old.job.job_id == handle.job_id:
            work = old.work
        attempts = list(old.attempts) if old is not None and old.kind == "job" else []
        if handle.job_id not in attempts:
            attempts.append(handle.job_id)
        record = TaskRecord(
            kind="job",
            mode=DEFERRED if self.op.deferrable else SYNC,
            try_number=self.identity.get("try_number"),
            handle=handle.to_dict(),
            delivered=delivered,
            preemptions=preemptions,
            work=work,
            attempts=attempts,
        )
        write_record(self.store, self.identity, record, self.secret)
        self.record = record
        state = self.context.get("task_state_store")
        if state is not None and not delivered:
            try:
                state.set(XCOM_JOB, handle.to_dict())
            except Exception as exc:  # noqa: BLE001 - the store record is what counts
                self.log.warning("could not record the job in the task state store: %s", exc)


def _state_store_record(context: Any) -> TaskRecord | None:
    """The job Airflow 3.3's task state store holds for the task (a fallback for a
    store that has no record)."""
    state = context.get("task_state_store")
    try:
        previous = state.get(XCOM_JOB) if state is not None else None
    except Exception:  # noqa: BLE001 - an unreadable state store means "nothing found"
        previous = None
    if isinstance(previous, dict) and previous.get("job_id"):
        return TaskRecord(kind="job", mode=SYNC, handle=previous)
    return None
