"""A deferred map task ends in its batch trigger when every child succeeded and nothing
must run on a worker after it: ``triggers.end_task``'s rule, for a batch.

The operator decides at deferral (``operators.end_task``, the same rule as a run
task's); the trigger decides once it has driven the batch to its end: every input
succeeded (a failed one fails the try on a worker, which retries it or returns error
values), every value is JSON as XCom holds it and the list at most
``end_task.MAX_XCOM_BYTES``, and the task's record still names this batch for this
try.  Otherwise the event resumes the task on a worker as before.

The finish is the worker's (``operators.batch_finish``), in its order, with the
record's two steps in one (the trigger's value is small and the record holds it):

1. every child's value read and verified (``core.batch.finish.gather_values``);
2. the batch's ended state saved (a later try collects the same values from it);
3. the XComs pushed (``return_value``, the final ``kinetic_batch`` counts), then the
   task's record says delivered and returned and holds them (``TaskRecord.xcoms``);
4. the batch's end: history, and the cleanup policy on every job it created
   (``core.batch.finish.batch_ended``);
5. the usage line, XCom and metrics (``deployment.usage``).

A trigger of the same try re-created after its event was lost hands the same XComs
again (``end_task.handed_before``): never a second run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow_provider_kinetic.core.batch import run as batchrun
from airflow_provider_kinetic.core.batch.finish import batch_ended, gather_values
from airflow_provider_kinetic.core.batch.manifest import batch_status
from airflow_provider_kinetic.core.batch.resume import save_live
from airflow_provider_kinetic.core.batch.state import SUCCEEDED, BatchState
from airflow_provider_kinetic.core.jobs.taskrecord import read_record, write_record
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.triggers import end_task as ending
from airflow_provider_kinetic.triggers.end_task import (
    USAGE,
    EndTask,
    NotHere,
    json_native,
    ours,
    value_xcoms,
)

#: The XCom a map task's counts go to (``operators.common.XCOM_BATCH``).
XCOM_BATCH = "kinetic_batch"


def store_and_secret(config_json: str) -> tuple[ObjectStore, Any]:
    """The batch's store (from the trigger's config) and the deployment's keyring."""
    from airflow_provider_kinetic.deployment.connection import config_from_json
    from airflow_provider_kinetic.deployment.signing import deployment_secret
    from airflow_provider_kinetic.gcp.gcs_auth import store_for

    return store_for(config_from_json(config_json)), deployment_secret()


def finish_batch_here(
    store: ObjectStore,
    backend: Any,
    secret: Any,
    state: BatchState,
    end: EndTask,
    log: Any,
) -> dict[str, Any]:
    """Finish the batch every child of which succeeded as a worker would (see the
    module) and return the XComs to end the task with; ``NotHere`` (nothing changed)
    when the worker must."""
    from airflow_provider_kinetic.deployment.signing import result_key_for_job
    from airflow_provider_kinetic.deployment.usage import account

    record = read_record(store, end.identity, secret)
    if record is None or not ours(record, state.group_id, end) or record.returned:
        raise NotHere("the task's record names another batch or try")
    failed = [i for i in range(state.total) if state.done.get(i) != SUCCEEDED]
    if failed:
        raise NotHere(f"{len(failed)} of its {state.total} inputs did not succeed")
    auth = state.template.result_auth
    gathered = gather_values(
        state,
        store,
        ordered=end.ordered,
        result_key=lambda job: result_key_for_job(job, auth),
        deliver=lambda value, _job, _blob: value,
    )
    if gathered.failures:  # a result that cannot be read: the worker says so its way
        raise NotHere(f"{len(gathered.failures)} of its results could not be read")
    xcoms = value_xcoms(list(gathered.values), end.push_value)
    counts = batchrun.counts(state)
    xcoms[XCOM_BATCH] = batch_status(state, store, counts)
    save_live(store, state, secret)  # the ended state: a later try collects from it
    ending.push_xcoms(end.identity, xcoms)  # Airflow has the values before anything goes
    ended = replace(record, delivered=True, returned=True, xcoms=dict(xcoms))
    write_record(store, end.identity, ended, secret)  # its holder until the task ends
    batch_ended(state, store, backend, delivered=True, cleanup=end.cleanup, kept_uris=(), log_=log)
    usage = account(store, [state.group_id], record.try_number, log)
    if usage is not None and json_native(usage):
        try:
            ending.push_xcoms(end.identity, {USAGE: usage})
            xcoms[USAGE] = usage
        except Exception as exc:  # noqa: BLE001 - an account, never the task's outcome
            log.warning("kinetic usage could not be pushed: %s", exc)
    return xcoms
