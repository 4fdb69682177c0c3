"""Finishing a map task's try: the batch's values to XCom, the task's record, the
batch's end (``core.batch.finish``), the asset event.

Functions of the try (``operators.batch_try.BatchTry``), as ``operators.batch_wait``
is its wait.
The order is what makes a try ended anywhere in it (Airflow terminating it) leave the
next try the same values, never a second run: the batch's ended state is saved, the
values go to XCom, the record says "delivered", the batch ends with its artifacts
held; the usage and the asset event follow, then the record says "returned" (the
try's last word) and only then do the held artifacts go.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.batch import logs as batchlogs
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.finish import batch_ended, gather_values, release_held
from airflow_provider_kinetic.core.batch.resume import save_live
from airflow_provider_kinetic.core.jobs.resultref import result_ref_uris
from airflow_provider_kinetic.deployment.signing import result_key_for_job
from airflow_provider_kinetic.exceptions import KineticBatchFailed
from airflow_provider_kinetic.operators import assets, reuse
from airflow_provider_kinetic.operators.batch_try import BatchTry, child_output_dirs
from airflow_provider_kinetic.operators.common import directory_uri, push_value
from airflow_provider_kinetic.operators.usage import report_usage
from airflow_provider_kinetic.operators.xcoms import xcom_value


def finish(t: BatchTry) -> list[Any]:
    """Every child has ended: deliver the values, then the asset event, then the
    record "returned" and only then the artifacts the policy deletes: a try ended
    before that (Airflow terminating it) leaves the next try the same values."""
    capacity = batchrun.counts(t.batch)["capacity"]  # counted before the batch ends
    result = deliver(t)
    emit(t, result, capacity)
    t.write_record(delivered=True, returned=True)  # the try's last word
    release_held(
        t.batch,
        t.store,
        t.backend,
        cleanup=t.op.cleanup,
        kept_uris=result_ref_uris(result) | t.cached_uris,
        log_=t.op.log,
    )
    return result


def deliver(t: BatchTry) -> list[Any]:
    """Gather every child's value (references where XCom cannot hold one), push the
    list to XCom, then mark the record delivered and end the batch (its history
    entry, its artifacts by the cleanup policy: ``core.batch.finish``)."""
    state, store, op = t.batch, t.store, t.op
    gathered = gather_values(
        state,
        store,
        ordered=op.ordered,
        result_key=lambda job: result_key_for_job(job, state.template.result_auth),
        deliver=lambda value, job, blob: xcom_value(value, store, job, blob, op.log),
    )
    t.waiting = False  # nothing is left running to cancel
    values, failures = gathered.values, gathered.failures
    if failures and not op.return_exceptions:
        end_batch(t, set(), delivered=False)
        report_usage(op, t.context, store, [state.group_id])
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
        batchoutcomes.describe_exception(v) if isinstance(v, BaseException) else v for v in values
    ]
    # The ended state first (a later try collects the same values from it), then
    # XCom, then the record: Airflow has the values before anything is deleted.
    save_live(store, state, t.secret)
    push_value(op, t.context, result)
    t.write_record(delivered=True)
    t.cached_uris = reuse.offer_inputs(t, state)  # cache=True: kept whatever the policy
    end_batch(t, result_ref_uris(values) | t.cached_uris, delivered=True)
    report_usage(op, t.context, store, [state.group_id])
    return result


def end_batch(t: BatchTry, kept_uris: set[str], delivered: bool) -> None:
    batch_ended(
        t.batch,
        t.store,
        t.backend,
        delivered=delivered,
        cleanup=t.op.cleanup,
        kept_uris=kept_uris,
        log_=t.op.log,
        hold=delivered,  # until the record says returned (``finish``)
    )


def emit(t: BatchTry, result: Any, capacity: dict[str, int]) -> None:
    """The batch's asset event: its parent output dir (``operators.assets``)."""
    state = t.batch
    out = directory_uri(state.template.output_dir) or state.template.output_dir
    extra = assets.batch_extra(state, result, out, child_output_dirs(state), capacity)
    assets.emit(t.op, t.context, out, extra, t.store)
