"""``cache=True`` in a task's try: take a delivered result of the same work, or run the
job and offer its result (``core.jobs.resultcache`` is the store side).

- :func:`look_up` (before a new job is submitted): a usable entry for the planned
  job's reuse key is a hit (:func:`take`: the value and output dir to XCom, no job);
  else the try claims the key and runs the job, or, when a concurrent identical task
  holds the claim, waits for its result (``[kinetic] cache_wait_s``) and runs its own
  job when that task's job failed, its claim went, or the wait ran out.  Never a
  failed result: only an entry is taken, and only a delivered job makes one.
- :func:`offer` (once a job is finished): a job that succeeded and delivered its value
  becomes the key's entry; the claim goes either way.

The log says hit or miss and why; XCom ``kinetic_cache`` says ``hit``, the job and the
task run that produced the result; a hit's history entry says it came from the cache.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.core.batch.plan import CACHE_KEYS
from airflow_provider_kinetic.core.batch.state import SUCCEEDED
from airflow_provider_kinetic.core.jobs import history, resultcache
from airflow_provider_kinetic.core.jobs.resultcache import (
    CACHE_KEY_FIELD,
    CacheEntry,
    CacheSettings,
)
from airflow_provider_kinetic.core.jobs.results import collect_with_blob
from airflow_provider_kinetic.core.jobs.taskrecord import Step
from airflow_provider_kinetic.core.spec.handles import (
    JobHandle,
    JobStatus,
    artifact_key,
    new_job_id,
)
from airflow_provider_kinetic.deployment.signing import result_key
from airflow_provider_kinetic.operators.common import (
    XCOM_OUTPUT_DIR,
    directory_uri,
    push_value,
)
from airflow_provider_kinetic.operators.xcoms import xcom_value

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.jobs.submit import PlannedJob

#: ``run`` below is the try (``operators.task_try.TaskTry``, which calls this module):
#: its store, identity, context, operator, log and ``claimed`` key.
TaskTry = Any

XCOM_CACHE = "kinetic_cache"
#: Rounds of claim-or-wait before a try runs its own job without the claim.
ROUNDS = 3


def owner(run: TaskTry) -> dict[str, Any]:
    """The claim's owner: the task run (a retry of it takes its own claim over)."""
    return {k: run.identity.get(k) for k in ("dag_id", "run_id", "task_id", "map_index")}


def check(op: Any, cache: Any, version: Any, ignore: Any) -> CacheSettings | None:
    """The operator's cache settings, checked at DAG parse time (a bad value raises
    naming itself and what is allowed)."""
    found = resultcache.settings(cache, version, ignore, op.python_callable, op.task_id)
    if found is not None and not getattr(op, "wait_for_completion", True):
        raise ValueError(
            f"task {op.task_id!r}: cache=True needs wait_for_completion=True (a "
            "submit-only task returns a handle, never a result to reuse)"
        )
    return found


@contextlib.contextmanager
def unclaimed_on_error(run: TaskTry) -> Iterator[None]:
    """A try that fails before its job is finished lets its claim go (a deferral is
    no failure: the resumed try finishes the job and offers it)."""
    try:
        yield
    except Exception:
        unclaim(run)
        raise


def look_up(run: TaskTry, planned: PlannedJob, step: Step = Step.SUBMIT) -> tuple[bool, Any]:
    """``(True, value)`` on a hit (delivered to XCom); ``(False, None)``: run the job
    (claimed when this try got the claim).  Only a try that would submit a new job
    looks (``step``): an earlier try's job of this work is adopted or collected."""
    key = planned.cache_key
    if key is None or step is not Step.SUBMIT:
        return False, None
    wait_s = conf.getfloat("kinetic", "cache_wait_s", fallback=resultcache.CACHE_WAIT_S)
    me = owner(run)
    for _ in range(ROUNDS):
        entry = resultcache.read(run.store, key)
        if entry is not None and resultcache.usable(run.store, entry, run.secret):
            return True, take(run, entry)
        if entry is not None:
            run.log.info(
                "cache: entry %s names a result (or output dir) no longer whole: dropped",
                key[:12],
            )
            resultcache.remove(run.store, key)
        if resultcache.claim(run.store, key, me):
            return False, _miss(run, key, "no delivered result of this work yet")
        held = resultcache.read_claim(run.store, key)
        if held is None:
            continue  # it went just now: claim again
        if held.owner == me:  # an earlier try of this task run claimed it
            return False, _miss(run, key, "no delivered result of this work yet (claimed)")
        why = resultcache.stale(run.store, held, _now())
        if why is not None:
            run.log.info("cache: the claim on %s is stale (%s): taken over", key[:12], why)
            resultcache.release(run.store, key)
            continue
        who = "/".join(str(held.owner.get(k)) for k in ("dag_id", "run_id", "task_id"))
        run.log.info(
            "cache: task %s runs the same work (job %s): waiting up to %.0f s for its result",
            who,
            held.job_id or "not yet submitted",
            wait_s,
        )
        waited = resultcache.wait_for(
            run.store,
            key,
            timeout_s=wait_s,
            poll_s=max(0.2, min(run.op.poll_interval, 5.0)),
            job_ended=_job_ended(run),
        )
        if waited.entry is not None:
            return True, take(run, waited.entry)
        run.log.info("cache: no result to take (%s)", waited.why)
    _push(run, hit=False)
    run.log.info("cache miss (key %s): running this task's own job", key[:12])
    return False, None


def _now() -> float:
    return time.time()


def _job_ended(run: TaskTry) -> Callable[[str], bool]:
    """Whether the backend says a claim's job ended (its ``handle.json`` read from the
    store); False when that cannot be told (the wait's deadline still applies)."""

    def ended(job_id: str) -> bool:
        try:
            blob = run.store.read_bytes(artifact_key(job_id, "handle.json"))
            handle = JobHandle.from_dict(json.loads(blob))
            backend = run.backend if handle.backend == run.backend.name else None
            return backend is not None and backend.status(handle).status.is_terminal
        except Exception:  # noqa: BLE001 - cannot tell: keep waiting
            return False

    return ended


def _miss(run: TaskTry, key: str, why: str) -> None:
    run.claimed = key
    run.log.info("cache miss (key %s): %s; running the job", key[:12], why)
    _push(run, hit=False)


def _push(run: TaskTry, hit: bool, entry: CacheEntry | None = None) -> None:
    value: dict[str, Any] = {"hit": hit, "job_id": entry.job_id if entry else None}
    for k in ("dag_id", "run_id", "task_id", "map_index"):
        value[k] = entry.producer.get(k) if entry else None
    run.context["ti"].xcom_push(key=XCOM_CACHE, value=value)


def take(run: TaskTry, entry: CacheEntry) -> Any:
    """A hit: the producer's verified result and output dir to XCom, a history entry
    saying it came from the cache; no job."""
    handle = JobHandle.from_dict(entry.handle)
    value, blob = collect_with_blob(
        run.store, handle.job_id, JobStatus.SUCCEEDED, result_key=result_key(handle)
    )
    run.log.info(
        "cache hit (key %s): the result of %s, made %s; no job launched",
        entry.key[:12],
        entry.describe(),
        entry.created_at,
    )
    multiple = bool(getattr(run.op, "multiple_outputs", False))
    delivered = xcom_value(value, run.store, handle.job_id, blob, run.log, multiple)
    ti = run.context["ti"]
    ti.xcom_push(key=XCOM_OUTPUT_DIR, value=directory_uri(entry.output_dir))
    _push(run, hit=True, entry=entry)
    push_value(run.op, run.context, delivered)
    hit_id = new_job_id()
    history.submitted(
        run.store,
        hit_id,
        run.identity,
        backend="cache",
        accelerator=handle.accelerator,
        func=handle.func_name,
        output_dir=entry.output_dir,
        kind=resultcache.HIT_KIND,
        cached_from={"job_id": entry.job_id, "key": entry.key, **entry.producer},
        artifacts={"state": f"none: the result is job {entry.job_id}'s (cache)"},
    )
    history.update(run.store, hit_id, "SUCCEEDED", f"from the cache: {entry.describe()}")
    return delivered


def offer(run: TaskTry, handle: JobHandle, succeeded: bool) -> None:
    """After a job is finished: its result becomes the entry of its key when it
    succeeded (its value delivered); the claim goes either way."""
    key = handle.extra.get(CACHE_KEY_FIELD)
    if not key or run.op.cache_settings is None:
        return
    try:
        if succeeded:
            entry = CacheEntry(
                key=str(key),
                job_id=handle.job_id,
                handle=handle.to_dict(),
                output_dir=directory_uri(handle.output_dir),
                created_at=history.now_iso(),
                cache_version=run.op.cache_settings.version if run.op.cache_settings else "",
                func=handle.func_name,
                producer={**owner(run), "try_number": run.identity.get("try_number")},
            )
            resultcache.record(run.store, entry)
            history.update(run.store, handle.job_id, cached_as=str(key))
            run.log.info("cache: the result of job %s is kept as %s", handle.job_id, key[:12])
    finally:
        resultcache.release(run.store, str(key), owner(run))
        run.claimed = None


def cached_result(run: TaskTry, handle: JobHandle) -> set[str]:
    """The result URI of ``handle`` when a cache entry names its job (a later try that
    retires the job, a clear of its task, must not delete it); else nothing."""
    key = handle.extra.get(CACHE_KEY_FIELD)
    result = {run.store.uri(artifact_key(handle.job_id, "result.pkl"))}
    try:
        entry = resultcache.read(run.store, str(key)) if key else None
    except Exception:  # noqa: BLE001 - cannot tell: keep it
        return result
    return result if entry is not None and entry.job_id == handle.job_id else set()


def name_job(run: TaskTry, handle: JobHandle) -> None:
    """The claim (if this task run holds it) names the job it submitted now: the first,
    or one that took over (a preemption's resubmit, a capacity step), so waiters follow
    the job that will deliver (never fatal)."""
    key = handle.extra.get(CACHE_KEY_FIELD)
    if not key:
        return
    try:
        resultcache.claim_job(run.store, str(key), owner(run), handle.job_id)
    except Exception as exc:  # noqa: BLE001 - waiters fall back on the deadline
        run.log.warning("cache: could not name job %s in the claim: %s", handle.job_id, exc)


def unclaim(run: TaskTry) -> None:
    """A try that ends without finishing its job lets its claim go (waiters run theirs)."""
    key = getattr(run, "claimed", None)
    if key:
        try:
            resultcache.release(run.store, key, owner(run))
        except Exception as exc:  # noqa: BLE001 - the try's own error matters more
            run.log.warning("cache: could not drop the claim on %s: %s", key[:12], exc)
        run.claimed = None


# ---- the map operator: per input ----------------------------------------------------

#: ``BatchState.extra``: input index (a string) -> where its cached result came from.
CACHE_HITS = "cache_hits"


def take_inputs(t: Any, state: Any) -> dict[str, dict[str, Any]]:
    """A new batch's inputs whose work has a delivered result end as SUCCEEDED with
    the producing job's result (no child is launched for them); XCom ``kinetic_cache``
    says hit or miss per input.  Returns the hits (index -> producer)."""
    keys = state.extra.get(CACHE_KEYS) or {}
    if t.op.cache_settings is None or not keys:
        return {}
    hits: dict[str, dict[str, Any]] = {}
    # A new batch starts its own dir empty: a result whose dir lies in it (a clear of
    # this same task run) would lose its files, so that input runs again.
    own = (directory_uri(state.template.output_dir) or "").rstrip("/") + "/"
    for index in list(state.queue):
        key = keys.get(str(index))
        entry = resultcache.read(t.store, key) if key else None
        if entry is None or not resultcache.usable(t.store, entry, t.secret):
            continue
        if (entry.output_dir or "").startswith(own):
            continue
        state.queue.remove(index)
        state.done[index] = SUCCEEDED
        state.jobs[index] = entry.job_id
        state.order.append(index)
        hits[str(index)] = {
            "job_id": entry.job_id,
            "output_dir": entry.output_dir,
            **entry.producer,
        }
    state.extra[CACHE_HITS] = hits
    t.op.log.info(
        "cache: %d of %d inputs hit (their results reused, no child launched); %d to run",
        len(hits),
        state.total,
        len(state.queue),
    )
    for index, producer in sorted(hits.items(), key=lambda kv: int(kv[0])):
        t.op.log.info("cache hit: inputs[%s] <- job %s", index, producer["job_id"])
    per_input = []
    for index in range(state.total):
        found = hits.get(str(index))
        value = {"hit": found is not None, "job_id": found["job_id"] if found else None}
        value.update(
            {k: (found or {}).get(k) for k in ("dag_id", "run_id", "task_id", "map_index")}
        )
        per_input.append(value)
    t.context["ti"].xcom_push(key=XCOM_CACHE, value=per_input)
    return hits


def note_inputs(t: Any, state: Any, hits: dict[str, dict[str, Any]]) -> None:
    """The batch's history entry says which inputs came from the cache."""
    if hits:
        history.update(t.store, state.group_id, cache_hits=hits)


def offer_inputs(t: Any, state: Any) -> set[str]:
    """After a batch delivered its values: each input that succeeded in a child of its
    own becomes its key's entry.  Returns the result URIs the entries hold (kept by the
    cleanup policy, as a referenced result is)."""
    keys = state.extra.get(CACHE_KEYS) or {}
    if t.op.cache_settings is None or not keys:
        return set()
    hits = state.extra.get(CACHE_HITS) or {}
    template, kept = state.template, set()
    for index, outcome in state.done.items():
        key = keys.get(str(index))
        if outcome != SUCCEEDED or not key or str(index) in hits or index not in state.jobs:
            continue
        job_id = state.jobs[index]
        handle = JobHandle(
            job_id=job_id,
            backend=state.backend,
            bucket_name=t.store.bucket,
            func_name=template.func_name,
            accelerator=template.options.accelerator,
            output_dir=template.output_uri(index),
            result_auth=template.result_auth,
            group_id=state.group_id,
            group_index=index,
        )
        entry = CacheEntry(
            key=str(key),
            job_id=job_id,
            handle=handle.to_dict(),
            output_dir=directory_uri(handle.output_dir),
            created_at=history.now_iso(),
            cache_version=t.op.cache_settings.version,
            func=template.func_name,
            producer={**owner(t), "try_number": t.identity.get("try_number"), "input": index},
        )
        resultcache.record(t.store, entry)
        kept.add(t.store.uri(artifact_key(job_id, "result.pkl")))
    if kept:
        t.op.log.info("cache: %d input result(s) kept for reuse", len(kept))
    return kept


def cached_output_dir(state: Any, index: int) -> str | None:
    """The output dir of an input whose result came from the cache (None: its own)."""
    return ((state.extra.get(CACHE_HITS) or {}).get(str(index)) or {}).get("output_dir")
