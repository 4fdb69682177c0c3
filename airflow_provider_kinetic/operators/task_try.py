"""One try of a ``KineticRunOperator`` task: what it works with, and its steps.

``TaskTry.open`` is called once per execution segment: in ``execute``, and again in
``execute_complete`` after a deferral.  It takes the connection's config, store and
backend, the task's identity, the deployment secret, and the task's record (read
once, ``operators.task_record``: the try keeps it current as it writes it).  Its
methods are the try's steps: plan and look back (``core.jobs.taskrecord``: adopt,
collect or submit anew), start / submit / publish, finish (``core.jobs.finish``, as
the job sensor's, then what needs Airflow), and the record's writes.  The wait in the
worker and the jobs that take over from an ended one (``operators.takeover``: capacity
steps, preemption re-submits) are functions of the try in ``operators.job_wait``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.catalog.capacity import parse_capacity
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.cleanup import after_job
from airflow_provider_kinetic.core.jobs.finish import describe_failure, finish_job, release_held
from airflow_provider_kinetic.core.jobs.progress import read_progress
from airflow_provider_kinetic.core.jobs.submit import PlannedJob, plan_job, submit_planned
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    Step,
    TaskRecord,
    decide_job,
    never_created,
    supersede_record,
    write_record,
)
from airflow_provider_kinetic.core.spec.failure import Failure, FailureClass
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport, new_job_id
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.deployment.signing import deployment_secret, result_key
from airflow_provider_kinetic.exceptions import job_failed
from airflow_provider_kinetic.links import job_links
from airflow_provider_kinetic.operators import assets, keyio, reuse
from airflow_provider_kinetic.operators.common import (
    XCOM_JOB,
    XCOM_OUTPUT_DIR,
    XCOM_PROGRESS,
    KineticOperatorBase,
    directory_uri,
    push_value,
    restore_xcom_push,
    show_job_logs,
    task_identity,
)
from airflow_provider_kinetic.operators.takeover import resubmit_policy
from airflow_provider_kinetic.operators.task_record import (
    load_record,
    next_record,
    note_in_state_store,
    restore_record,
    stored_record,
)
from airflow_provider_kinetic.operators.usage import report_usage
from airflow_provider_kinetic.operators.xcoms import xcom_value


@dataclass
class Earlier:
    """What an earlier try's job means for this try (``decide_job``): submit anew,
    adopt ``job`` (still running) or collect it (finished); ``report``: its status."""

    step: Step
    job: JobHandle | None
    report: StatusReport | None


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
    #: ``cache=True``: the reuse key this try claimed (``operators.reuse``: concurrent
    #: identical tasks wait for its result); None once let go.
    claimed: str | None = None

    @classmethod
    def open(cls, op: Any, context: Any, backend_kind: str | None = None) -> TaskTry:
        """The try's config, store, backend (``backend_kind``, else the one the
        operator's accelerator runs on), identity, secret and record."""
        restore_xcom_push(op)
        config = op.hook.get_config()
        store = op.hook.get_store()
        kind = backend_kind or config.backend_kind(op.accelerator_spec(), op.slice_count())
        backend = op.hook.get_backend(kind)
        identity = task_identity(context)
        secret = deployment_secret()
        record = load_record(store, identity, secret, context)
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
        ``superseded/`` and gets the failure rule of the cleanup policy; one its try
        never created (it stopped before its create returned) leaves nothing: no
        history, no attempt, and its upload is removed."""
        record = self.record
        step, old, report, why = decide_job(
            record, self.backend, self.store, result_key, planned.work
        )
        if record is not None:
            self.log.info("kinetic: earlier try found: %s -> %s", why, step.value)
            if (
                step is Step.SUBMIT
                and old is not None
                and report is not None
                and never_created(self.store, old, report)
            ):
                # No job, no history: what its upload left goes, and the task's
                # attempts (what its usage sums) never had it.
                self.store.delete_prefix(f"{old.job_id}/")
                attempts = [a for a in record.attempts if a != old.job_id]
                self.record = replace(record, attempts=attempts)
                return Earlier(step, None, None)
            if step is Step.SUBMIT and old is not None:  # keep the old record for history
                supersede_record(self.store, self.identity, record, self.secret)
                entry = history.read(self.store, old.job_id) or {}
                if (
                    report is not None
                    and report.status.is_terminal
                    and entry.get("state") not in history.ENDED
                ):
                    # It ended and nobody collected it: its entry says how, not
                    # SUBMITTED as if it still ran (holds would keep its files).
                    history.update(
                        self.store, old.job_id, report.status.value, f"not collected: {why}"
                    )
                self.retire(old)  # cancelled or ended, and never collected
        return Earlier(step, old, report)

    def retire(self, handle: JobHandle, archive_logs: bool | None = None) -> None:
        """The failure rule of the cleanup policy, for a job this try does not collect
        (superseded, a capacity step given up, preempted)."""
        kept = reuse.cached_result(self, handle)  # a cache entry holds it: never deleted
        after_job(
            self.store,
            self.backend,
            [handle],
            succeeded=False,
            cleanup=self.op.cleanup,
            kept_uris=kept,
            log_=self.log,
            archive_logs=archive_logs,
        )

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
            reuse.name_job(self, handle)  # cache=True: waiters follow this job
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
        self.write_record(handle, delivered=True, returned=True)  # the handle is the value
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
        before = stored_record(self.store, self.identity, self.context, self.record)
        self.write_record(provisional)
        try:
            submit_planned(planned, self.backend, self.store)
        except Exception as exc:
            if not self._job_exists(planned.handle):
                restore_record(self.store, self.identity, self.context, before, self.log)
                self.record = before.record
            phase = getattr(exc, "failure_phase", None)  # the job's environment failed
            if phase is None:
                raise
            failure = Failure(
                FailureClass.INFRA, phase=phase, job_id=job_id, message=describe_failure(exc)
            )
            self.log.error("kinetic job %s %s", job_id, failure.describe())
            raise job_failed(f"kinetic job {job_id} {failure.describe()}", failure) from exc
        return planned.handle

    def _job_exists(self, handle: JobHandle) -> bool:
        """Whether a job whose submit raised exists after all (unknown counts as yes:
        then its record stays, so no later try runs it a second time)."""
        try:
            return self.backend.exists(handle)
        except Exception as exc:  # noqa: BLE001 - cannot tell: keep the record
            self.log.warning("cannot tell whether job %s exists: %s", handle.job_id, exc)
            return True

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

    # ---- waiting in the worker (operators.job_wait) -----------------------------------
    def show_logs(self, handle: JobHandle, offset: int) -> int:
        """The job's log from ``offset`` into the task log; the new offset."""
        return show_job_logs(self.backend, handle, offset, self.log)

    # ---- finishing ---------------------------------------------------------------------
    def finish(self, handle: JobHandle, report: StatusReport, offset: int) -> Any:
        """The rest of the job's log, then ``core.jobs.finish`` (its value to XCom and
        the record "delivered" before anything is deleted), the task's usage; on
        success its output key and the output dir's asset event, then the record
        "returned" and only then the artifacts the policy deletes: a try ended before
        that (Airflow terminating it) leaves the next try the same value to collect.
        On every path that delivers a value (this worker, a resumed deferral, a later
        try)."""
        self.show_logs(handle, offset)
        self.log.info("kinetic job %s finished: %s", handle.job_id, report.describe())
        self.push_progress(handle)  # before the cleanup deletes the job's dir
        self.handle = None  # done: on_kill must not touch a finished job
        done = finish_job(
            self.store,
            self.backend,
            handle,
            report,
            cleanup=self.op.cleanup,
            result_key=result_key(handle),
            deliver=lambda value, blob: self.deliver(handle, value, blob),
            checkpoints_of=self.identity,
            hold=True,
            keep_result=self.op.cache_settings is not None,
            log_=self.log,
            infra_exit_codes=resubmit_policy(self.op).exit_codes,
        )
        reuse.offer(self, handle, done.succeeded and done.read)
        # The task's usage over every job its run had (the record's attempts).
        attempts = self.record.attempts if self.record is not None else []
        report_usage(self.op, self.context, self.store, attempts or [handle.job_id])
        if done.error is not None:
            failure = done.classified
            if failure is not None:
                self.log.error("kinetic job %s %s", handle.job_id, failure.describe())
                self.context["ti"].xcom_push(
                    key=XCOM_JOB, value={**handle.to_dict(), "failure": failure.to_dict()}
                )
            raise job_failed(
                f"kinetic job {handle.job_id} failed: {done.failure}", failure, handle.job_id
            ) from done.error
        if handle.output_dir:  # the output's event first: a key's event repeats its extra
            out = directory_uri(handle.output_dir) or handle.output_dir
            assets.emit(
                self.op, self.context, out, assets.job_extra(handle, done.value, out), self.store
            )
        keyio.put_output_key(self.op, self.context, self.store, handle)
        self.write_record(handle, delivered=True, returned=True)  # the try's last word
        release_held(self.store, done, self.op.cleanup, self.log)
        return done.value

    def push_progress(self, handle: JobHandle) -> None:
        """The function's last progress update (``core.jobs.progress``) as XCom
        ``kinetic_progress``; nothing when it reported none."""
        last = read_progress(self.store, handle.job_id)
        if last is not None:
            self.context["ti"].xcom_push(key=XCOM_PROGRESS, value=last.to_xcom())

    def deliver(self, handle: JobHandle, value: Any, blob: bytes) -> Any:
        """The value as XCom holds it (a reference when it does not fit), pushed now,
        and the record "delivered": Airflow has it before anything is deleted."""
        multiple = bool(getattr(self.op, "multiple_outputs", False))
        delivered = xcom_value(value, self.store, handle.job_id, blob, self.log, multiple)
        push_value(self.op, self.context, delivered)
        self.write_record(handle, delivered=True)
        return delivered

    # ---- the task's record -------------------------------------------------------------
    def deferring(self, handle: JobHandle) -> None:
        """The record says DEFERRED from the moment the try hands ``handle`` to the
        triggerer, never before: until then the worker waits for it (a deferrable try
        watching its job for ``defer_grace_s`` first), so a try killed there leaves a
        job the next try adopts, not one it cancels as a cleared deferred try's."""
        self.write_record(handle, mode=DEFERRED)

    def write_record(
        self,
        handle: JobHandle,
        *,
        mode: str = SYNC,
        delivered: bool = False,
        returned: bool = False,
        preemptions: int | None = None,
        resubmits: dict[str, int] | None = None,
    ) -> None:
        """The task's record: this try's job, how it waits now (``mode``: SYNC in the
        worker, DEFERRED once handed to the triggerer), its work digest, whether its
        value is in XCom (``delivered``) and handed back to Airflow (``returned``);
        while the job is not delivered, the task state store names it too."""
        record = next_record(
            self.record,
            handle,
            mode=mode,
            try_number=self.identity.get("try_number"),
            work=self.work,
            delivered=delivered,
            returned=returned,
            preemptions=preemptions,
            resubmits=resubmits,
        )
        write_record(self.store, self.identity, record, self.secret)
        self.record = record
        if not delivered:
            note_in_state_store(self.context, handle, self.log)
