"""A KineticRunOperator try's job: submitted, published, recorded, preempted.

Every try of the task keeps a record of its job in the store (``core.jobs.taskrecord``;
Airflow 3.3's task state store as a fallback), written *before* the job is created,
so a later try finds the job instead of running it twice.  The record also counts
the task's preemption re-submits (``preemption_retries``), which do not use the
task's Airflow ``retries``.

``RunTriesBase`` is the bottom of KineticRunOperator's bases: the synchronous wait
(``run_sync``) and the deferred wait (``run_deferred``) build on it.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.catalog.capacity import chain_for, parse_capacity
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.cleanup import after_job
from airflow_provider_kinetic.core.jobs.fallback import describe_step, next_step
from airflow_provider_kinetic.core.jobs.results import is_preemption
from airflow_provider_kinetic.core.jobs.submit import PlannedJob, plan_job, submit_planned
from airflow_provider_kinetic.core.jobs.taskrecord import (
    DEFERRED,
    SYNC,
    TaskRecord,
    read_record,
    record_key,
    write_record,
)
from airflow_provider_kinetic.core.spec.handles import JobHandle, StatusReport, new_job_id
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.links import job_links
from airflow_provider_kinetic.operators import keyio
from airflow_provider_kinetic.operators.capacity import request_fields as capacity_fields
from airflow_provider_kinetic.operators.common import (
    XCOM_JOB,
    XCOM_OUTPUT_DIR,
    KineticOperatorBase,
    directory_uri,
    task_identity,
)


class RunTriesBase(KineticOperatorBase):
    """Submitting, publishing and recording the job of a try (see KineticRunOperator).

    ``_handle`` is the job this try waits for (``on_kill`` cancels it); ``None`` once
    it is finished or when nobody waits for it.
    """

    preemption_retries: int
    #: This try's work digest (``_plan``); None until planned, or when not computable.
    _work: str | None = None
    #: Link key -> URL pushed in this execution segment (``links._XComLink``); None in
    #: a resumed segment (Airflow's end-of-segment push then reads XCom).
    published_links: dict[str, str] | None = None
    _handle: JobHandle | None
    _backend: Backend | None
    _store: ObjectStore | None

    def _plan(
        self, context: Any, config: KineticConfig, store: ObjectStore, step: int = 0
    ) -> PlannedJob:
        """This try's job (for capacity step ``step``), validated and packed under a new
        id; nothing uploaded or built.  Its work digest is what an earlier try's job is
        compared with."""
        request = self.build_request(task_identity(context), store.uri, context)
        request, _, pins = keyio.pin_request(self, context, store, request)  # kinetic:// Data
        self.resolve_image(request, config, store, build=False)
        planned = plan_job(request, config, store, new_job_id(), deployment_secret(), step)
        self._work = planned.work
        return keyio.with_pins(planned, pins)

    def _submit(
        self,
        context: Any,
        config: KineticConfig,
        backend: Backend,
        store: ObjectStore,
        planned: PlannedJob | None = None,
    ) -> JobHandle:
        """Submit a planned job (a new plan when none is given), recording its id
        *before* it is created: a worker that dies in between leaves a record a retry
        can follow (and never a second job).  A missing bundled image is built first.
        A submit that is rejected (an upload, a requirements venv, the create call) and
        leaves no job puts the task's record back as it was: no record names a job
        that was never submitted, so the next try is the try it would have been."""
        planned = planned or self._plan(context, config, store)
        if planned.image is not None:
            # Cloud Build and Artifact Registry clients: imported only to submit.
            from airflow_provider_kinetic.gcp.image_build import prepare_image

            prepare_image(planned.image, config, store)  # before any upload
            self.log.info("kinetic: %s", planned.image.describe())
        job_id = planned.spec.job_id
        provisional = JobHandle(
            job_id=job_id,
            backend=backend.name,
            bucket_name=store.bucket,
            namespace=config.namespace,
            k8s_name=backend.object_name(job_id),
        )
        before = self._record_snapshot(context, store)
        self._write_record(context, store, provisional)
        try:
            submit_planned(planned, backend, store)
        except Exception:
            if not self._job_exists(backend, planned.handle):
                self._restore_record(context, store, before)
            raise
        return planned.handle

    def _job_exists(self, backend: Backend, handle: JobHandle) -> bool:
        """Whether a job whose submit raised exists after all (unknown counts as yes:
        then its record stays, so no later try runs it a second time)."""
        try:
            return backend.exists(handle)
        except Exception as exc:  # noqa: BLE001 - cannot tell: keep the record
            self.log.warning("cannot tell whether job %s exists: %s", handle.job_id, exc)
            return True

    def _record_snapshot(self, context: Any, store: ObjectStore) -> tuple[bytes | None, Any]:
        """The task's record as stored (its sealed bytes) and its task state store entry."""
        try:
            sealed: bytes | None = store.read_bytes(record_key(task_identity(context)))
        except ObjectNotFound:
            sealed = None
        state = context.get("task_state_store")
        try:
            previous = state.get(XCOM_JOB) if state is not None else None
        except Exception:  # noqa: BLE001 - an unreadable state store holds nothing of ours
            previous = None
        return sealed, previous

    def _restore_record(
        self, context: Any, store: ObjectStore, before: tuple[bytes | None, Any]
    ) -> None:
        """Put back what ``_record_snapshot`` saw (nothing: no record at all)."""
        sealed, previous = before
        key = record_key(task_identity(context))
        if sealed is None:
            store.delete(key)
        else:
            store.write_bytes(key, sealed, content_type="application/json")
        state = context.get("task_state_store")
        try:
            if state is not None and previous is not None:
                state.set(XCOM_JOB, previous)
            elif state is not None:
                state.delete(XCOM_JOB)
        except Exception as exc:  # noqa: BLE001 - the store record is what counts
            self.log.warning("could not reset the task state store: %s", exc)
        self.log.info("kinetic: the submit was rejected; the task's record is as it was")

    def _publish(self, context: Any, handle: JobHandle) -> None:
        """XComs a person or a downstream task needs while the job runs."""
        self._handle = handle
        ti = context["ti"]
        ti.xcom_push(key=XCOM_JOB, value=handle.to_dict())
        ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(handle.output_dir))
        keyio.push_pins(context, handle)
        self.published_links = job_links(handle, self.kinetic_conn_id)
        for key, url in self.published_links.items():
            ti.xcom_push(key=key, value=url)
        self.log.info("kinetic job %s: output dir %s", handle.job_id, handle.output_dir)
        if handle.capacity:
            what = parse_capacity(handle.capacity).describe
            self.log.info("kinetic job %s asks for capacity: %s", handle.job_id, what)

    # ---- capacity fallback ---------------------------------------------------------
    def _capacity_chain(self, config: KineticConfig) -> list[str]:
        """The task's capacity steps as rendered (the connection's default when the
        task names none): the same chain the task's jobs were planned with."""
        fields = capacity_fields(
            self.capacity, self.capacity_wait, self.priority_class, self.max_run_duration
        )
        chain = chain_for(fields["capacity"], self.accelerator_spec(), config.capacity)
        return [str(step) for step in chain]

    def _next_capacity(
        self,
        context: Any,
        config: KineticConfig,
        backend: Backend,
        store: ObjectStore,
        handle: JobHandle,
        report: StatusReport,
    ) -> JobHandle | None:
        """The job of the next capacity step, when ``handle``'s step found no capacity
        and nothing of it ever started (``core.jobs.fallback``); None otherwise."""
        chain = self._capacity_chain(config)
        step = next_step(chain, handle, report, store)
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
            store, handle.job_id, history.CANCELLED, f"{report.reason}: {report.message}"
        )
        backend.cancel(handle)  # delete the Job that never ran (its pods never started)
        after_job(store, backend, [handle], succeeded=False, mode=self.cleanup, log_=self.log)
        new = self._submit(
            context, config, backend, store, self._plan(context, config, store, step)
        )
        self._write_record(context, store, new)
        self._publish(context, new)
        return new

    # ---- the task's record ----------------------------------------------------------
    def _read_record(self, context: Any, store: ObjectStore) -> TaskRecord | None:
        """The task's record in the store; Airflow 3.3's task state store as a fallback."""
        record = read_record(store, task_identity(context), deployment_secret())
        if record is not None:
            return record
        state = context.get("task_state_store")
        try:
            previous = state.get(XCOM_JOB) if state is not None else None
        except Exception:  # noqa: BLE001 - an unreadable state store means "nothing found"
            previous = None
        if isinstance(previous, dict) and previous.get("job_id"):
            return TaskRecord(kind="job", mode=SYNC, handle=previous)
        return None

    def _write_record(
        self,
        context: Any,
        store: ObjectStore,
        handle: JobHandle,
        *,
        delivered: bool = False,
        preemptions: int | None = None,
    ) -> None:
        """The task's record: this try's job, how it waits, its work digest (this try's,
        else the record's: a resumed deferred try has not planned)."""
        identity = task_identity(context)
        secret = deployment_secret()
        work = getattr(self, "_work", None)
        old = read_record(store, identity, secret)
        if preemptions is None:
            preemptions = self._preemptions(old)
        if work is None and old is not None and old.job and old.job.job_id == handle.job_id:
            work = old.work
        attempts = list(old.attempts) if old is not None and old.kind == "job" else []
        if handle.job_id not in attempts:
            attempts.append(handle.job_id)
        record = TaskRecord(
            kind="job",
            mode=DEFERRED if self.deferrable else SYNC,
            try_number=identity.get("try_number"),
            handle=handle.to_dict(),
            delivered=delivered,
            preemptions=preemptions,
            work=work,
            attempts=attempts,
        )
        write_record(store, identity, record, secret)
        state = context.get("task_state_store")
        if state is not None and not delivered:
            try:
                state.set(XCOM_JOB, handle.to_dict())
            except Exception as exc:  # noqa: BLE001 - the store record is what counts
                self.log.warning("could not record the job in the task state store: %s", exc)

    # ---- preemption -------------------------------------------------------------------
    @staticmethod
    def _preemptions(record: TaskRecord | None) -> int:
        return record.preemptions if record is not None and record.kind == "job" else 0

    def _preempted(
        self, context: Any, store: ObjectStore, handle: JobHandle, report: StatusReport
    ) -> bool:
        """A platform kill (spot reclaim, eviction) with budget left for this task."""
        if not is_preemption(report, store, handle):
            return False
        used = self._preemptions(read_record(store, task_identity(context), deployment_secret()))
        if used >= self.preemption_retries:
            self.log.warning(
                "kinetic job %s was preempted (%s) and the task's %d preemption retries are "
                "used up",
                handle.job_id,
                report.describe(),
                self.preemption_retries,
            )
            return False
        return True

    def _resubmit_preempted(
        self,
        context: Any,
        config: KineticConfig,
        backend: Backend,
        store: ObjectStore,
        handle: JobHandle,
        report: StatusReport,
    ) -> JobHandle:
        used = self._preemptions(read_record(store, task_identity(context), deployment_secret()))
        self.log.warning(
            "kinetic job %s was preempted (%s): submitting it again (preemption retry %d/%d; "
            "the task's Airflow retries are not used)",
            handle.job_id,
            report.describe(),
            used + 1,
            self.preemption_retries,
        )
        history.update(store, handle.job_id, "PREEMPTED", report.reason)
        after_job(
            store,
            backend,
            [handle],
            succeeded=False,
            mode=self.cleanup,
            log_=self.log,
            archive_logs=True,
        )
        backend.cancel(handle)  # delete what is left of it
        new = self._submit(context, config, backend, store)
        self._write_record(context, store, new, preemptions=used + 1)
        self._publish(context, new)
        return new
