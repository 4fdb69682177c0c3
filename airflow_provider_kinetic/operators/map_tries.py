"""A KineticMapOperator try's batch: resumed only for the same work, recorded, delivered.

Every try of the task keeps a record of its batch in the store (``core.jobs.taskrecord``)
with the batch's work digest (function, shared arguments, every input, options).  A
later try resumes the batch only when its own plan is the same work: then only failed
or missing children run again; otherwise (the function was fixed, the inputs changed)
the old batch's running children are cancelled, its record is kept for history and a
new batch starts.  Results reach XCom before the record says "delivered" and before
any artifact is deleted.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.batch import logs as batchlogs
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
from airflow_provider_kinetic.core.keys.window import BroadcastWindow
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore
from airflow_provider_kinetic.exceptions import KineticBatchFailed
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.hooks.signing import deployment_secret, result_key, result_key_for_job
from airflow_provider_kinetic.operators.common import (
    KineticOperatorBase,
    push_value,
    result_ref_uris,
    task_identity,
    xcom_value,
)
from airflow_provider_kinetic.operators.usage import report_usage


class MapTriesBase(KineticOperatorBase):
    """Resuming, recording and delivering the batch of a try (see KineticMapOperator)."""

    ordered: bool
    return_exceptions: bool
    _state: BatchState | None

    def __init__(self, *, broadcast: bool | BroadcastWindow = False, **kwargs: Any) -> None:
        """``broadcast``: ``True`` or a ``BroadcastWindow`` (its fanout and timeout):
        the children's shared ``Data`` travels as a tree, one child reading the store
        and the rest each other (``core/keys/databroadcast.py``)."""
        super().__init__(**kwargs)
        self.broadcast = databroadcast.window_of(broadcast)

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
                store, backend, config, record.group_id, secret, result_key,
                cancel_live=changed or record.mode == DEFERRED,
            )  # fmt: skip
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
            batchrun.write_manifest(state, store)
        values, failures = batchrun.gather(
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
            batchrun.describe_exception(v) if isinstance(v, BaseException) else v for v in values
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
