"""A KineticMapOperator try's batch: resumed only for the same work, recorded, watched
(its children's status, logs and the ``kinetic_batch`` XCom), delivered.

Every try of the task keeps a record of its batch in the store (``core.jobs.taskrecord``)
with the batch's work digest (function, shared arguments, every input, options).  A
later try resumes the batch only when its own plan is the same work: then only failed
or missing children run again; otherwise (the function was fixed, the inputs changed)
the old batch's running children are cancelled, its record is kept for history and a
new batch starts.  Results reach XCom before the record says "delivered" and before
any artifact is deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import manifest as batchmanifest
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.finish import batch_ended
from airflow_provider_kinetic.core.batch.resume import resume_batch
from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.jobs.signing import ResultAuthError
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
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.deployment.signing import (
    deployment_secret,
    result_key,
    result_key_for_job,
)
from airflow_provider_kinetic.exceptions import KineticBatchFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.operators import assets
from airflow_provider_kinetic.operators.common import (
    XCOM_BATCH,
    XCOM_OUTPUT_DIR,
    XCOM_OUTPUT_DIRS,
    KineticOperatorBase,
    directory_uri,
    push_value,
    result_ref_uris,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.operators.usage import report_usage


class MapTriesBase(KineticOperatorBase):
    """Resuming, recording, watching and delivering the batch of a try (see
    KineticMapOperator)."""

    ordered: bool
    return_exceptions: bool
    child_log_bytes_per_poll: int
    _state: BatchState | None
    _line: batchlogs.StatusLine | None
    broadcast: BroadcastWindow | None

    def with_broadcast(self, planned: tuple[Any, ...]) -> tuple[Any, ...]:
        """The planned batch, its children's env carrying the broadcast window."""
        if self.broadcast is not None:
            planned[0].template.env.update(databroadcast.window_env(self.broadcast))
        return planned

    def _resume(
        self, context: Any, hook: KineticHook, store: ObjectStore, work: str | None
    ) -> BatchState | None:
        """An earlier try's batch, reattached when it runs the same ``work`` (only failed
        or missing children run again); a batch of other work (the function was fixed,
        the inputs changed) has its running children cancelled and is not resumed."""
        identity, secret = task_identity(context), deployment_secret()
        record = read_record(store, identity, secret)
        if record is None or record.kind != "batch" or not record.group_id:
            return None
        if record.delivered:
            supersede_record(store, identity, record, secret)
            return None
        config = hook.get_config()
        backend = hook.get_backend(config.backend_kind(self.accelerator_spec()))
        changed = other_work(record, work)
        try:
            state = resume_batch(
                store,
                backend,
                config,
                record.group_id,
                secret,
                result_key,
                cancel_live=changed or record.mode == DEFERRED,
            )
        except (ObjectNotFound, ResultAuthError) as exc:
            self.log.warning("cannot resume batch %s (%s): starting anew", record.group_id, exc)
            return None
        if changed:
            supersede_record(store, identity, record, secret)
            self.log.info(
                "kinetic: batch %s of an earlier try ran other work than this try's (its "
                "code, inputs or options changed since): its running children were "
                "cancelled; starting a new batch",
                record.group_id,
            )
            return None
        self.log.info("kinetic: resuming batch %s of an earlier try (same work)", record.group_id)
        return state

    def _write_record(
        self, context: Any, store: ObjectStore, state: BatchState, delivered: bool = False
    ) -> None:
        identity = task_identity(context)
        mode = DEFERRED if self.deferrable else SYNC
        record = TaskRecord(
            kind="batch",
            mode=mode,
            try_number=identity.get("try_number"),
            group_id=state.group_id,
            delivered=delivered,
            work=state.work,
        )
        write_record(store, identity, record, deployment_secret())

    def _complete(self, state: BatchState, store: ObjectStore, context: Any = None) -> list[Any]:
        """Gather every child's value (references where XCom cannot hold one), push the
        list to XCom, then mark the record delivered and delete the artifacts."""
        if state.manifest_dirty:
            batchmanifest.write_manifest(state, store)
        values, failures = batchoutcomes.gather(
            state,
            store,
            ordered=self.ordered,
            result_key=lambda job: result_key_for_job(job, state.template.result_auth),
            deliver=lambda value, job, blob: xcom_value(value, store, job, blob, self.log),
        )
        self._state = None
        if failures and not self.return_exceptions:
            self._batch_ended(state, store, set(), delivered=False)
            if context is not None:
                report_usage(self, context, store, [state.group_id])
            raise KineticBatchFailed(
                batchlogs.failure_summary(state, failures),
                group_id=state.group_id,
                failures=failures,
                partial_results=values,
            )
        if failures:  # returned as error values: their errors and log tails still show
            self.log.warning(
                "%s\n(return_exceptions=True: returned as error values in their positions)",
                batchlogs.failure_summary(state, failures),
            )
        result = [
            batchoutcomes.describe_exception(v) if isinstance(v, BaseException) else v
            for v in values
        ]
        if context is not None:
            push_value(self, context, result)  # Airflow has it before anything is deleted
            self._write_record(context, store, state, delivered=True)
        self._batch_ended(state, store, result_ref_uris(values), delivered=True)
        if context is not None:
            report_usage(self, context, store, [state.group_id])
        return result

    def _batch_ended(
        self,
        state: BatchState,
        store: ObjectStore,
        kept_uris: set[str],
        delivered: bool,
    ) -> None:
        backend = KineticHook(self.kinetic_conn_id).get_backend(state.backend)
        batch_ended(
            state,
            store,
            backend,
            delivered=delivered,
            mode=self.cleanup,
            kept_uris=kept_uris,
            log_=self.log,
        )

    # ---- observing and reporting the batch -----------------------------------------
    def _poll(self, backend: Backend, store: ObjectStore, state: BatchState) -> None:
        handles = list(state.active.values())
        reports = backend.batch_status(state.group_id, handles) if handles else {}
        # Before observe: it deletes finished children's Jobs (and their pod logs).
        batchlogs.show(state, backend, reports, self._child_line, self.child_log_bytes_per_poll)
        finished = batchrun.observe(state, reports, backend, store)
        batchlogs.log_failures(state, finished, reports, self.log)
        batchlogs.forget_finished(state)

    def _child_line(self, index: int, line: str) -> None:
        self.log.info("[child %d] %s", index, line)

    def _report(self, context: Any, state: BatchState, store: ObjectStore) -> None:
        """The status line and the ``kinetic_batch`` XCom, when a count changed (the
        line also once a minute): not one line and one XCom write per poll."""
        c = batchrun.counts(state)
        key = tuple(v for k, v in c.items() if k != "capacity")
        if self._line is None:
            self._line = batchlogs.StatusLine()
        changed = key != self._line.last
        if not self._line.due(key):
            return
        self.log.info(
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
        context["ti"].xcom_push(
            key=XCOM_BATCH,
            value={
                "group_id": state.group_id,
                "bucket": store.bucket,
                "manifest_uri": store.uri(batchmanifest.manifest_key(state.group_id)),
                "output_dir": state.template.output_dir,
                "counts": c,
            },
        )

    def _emit(self, context: Any, state: BatchState, result: Any, capacity: dict[str, int]) -> None:
        """The batch's asset event: its parent output dir (``operators.assets``)."""
        out = directory_uri(state.template.output_dir) or state.template.output_dir
        extra = assets.batch_extra(state, result, out, child_output_dirs(state), capacity)
        assets.emit(self, context, out, extra)


def push_output_dirs(context: Mapping[str, Any], state: Any) -> None:
    """A batch's ``output_dir`` (the parent) and ``kinetic_output_dirs`` (each input's
    own dir, in input order), so a downstream task finds a child's files without
    the function returning its ``KINETIC_OUTPUT_DIR``."""
    ti = context["ti"]
    ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(state.template.output_dir))
    ti.xcom_push(key=XCOM_OUTPUT_DIRS, value=child_output_dirs(state))


def child_output_dirs(state: Any) -> list[str]:
    """Each input's output dir of a batch, in input order, as ``Data`` takes it."""
    return [directory_uri(state.template.output_uri(i)) or "" for i in range(state.total)]
