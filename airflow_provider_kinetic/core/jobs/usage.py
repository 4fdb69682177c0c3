"""Usage: what each job held (accelerator, chips, hosts, capacity), for how long, and
what waiting for it cost in time; summed per task for its log line, its
``kinetic_usage`` XCom, the Kinetic page and ``airflow kinetic usage``.

Where the times come from, best first (each one something actually saw):

- **submitted**: the history entry's ``submitted_at`` (the handle's creation); for a
  batch child, when its ``handle.json`` was written (children are launched over time
  under the batch's cap, so the batch's own submit time would overstate their wait);
- **admitted**: ``admitted_at``, recorded by :func:`note_admitted` when Kueue admits
  the job (absent without Kueue);
- **started**: the runner's start record (``{job_id}/started.json``, written first
  thing, ``core.jobs.checkpoint``), else ``started_at`` of the entry (when a waiting
  task saw RUNNING: later than the real start by up to one poll); a batch child's by
  its start record's write time (one listing per child, no read);
- **ended**: when the runner wrote its result (``result.pkl``), else the entry's
  ``ended_at`` (when a waiting task saw the end: a preempted or killed job writes no
  result), else, for an ended job, its last write to the store.

Run time (and so chip-hours = chips over all hosts x run hours) counts from the
runner's start to its end: the wait for nodes, image pulls and pod start-up is queued
time, not run time.  A job whose start or end nobody recorded is *unmeasured*: it is
counted as an attempt and named as unmeasured, never given a made-up duration.  A job
that ended without a start record and without a result, its artifacts still there,
never started: it ran 0 s.

The runner's records live in ``{job_id}/``, which the cleanup policy deletes once a
value is delivered; so :func:`record_usage` freezes an ended job's usage into its
history entry (``usage``) before that, and later readers show the same numbers.
Costs come only from a price table the deployment gives (``[kinetic] price_table``,
parsed on the Airflow side, ``deployment/prices.py``); without one there is no cost field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import (
    InvalidAcceleratorError,
    parse_accelerator,
)
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import STARTED_NAME, read_started
from airflow_provider_kinetic.core.jobs.usage_text import (
    amount,
    failure_class_of,
    lost_line,
    lost_to_failures,
    plural,
    wait,
)
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.stat import stat_objects

log = logging.getLogger(__name__)

#: ``{family: {capacity: USD per chip-hour}}``: families ``tpu-v6e``, ``gpu-h100``
#: (catalog names), capacities ``spot``, ``reservation`` or ``reservation:r1``, ``*``.
PriceTable = Mapping[str, Mapping[str, float]]
#: Capacity of a job whose entry names none (jobs from before capacity kinds).
DEFAULT_CAPACITY = "on-demand"
RESULT_NAMES = ("result.pkl", "result.pkl.sig")
HANDLE_NAME = "handle.json"
IDENTITY = ("dag_id", "task_id", "run_id", "map_index", "try_number")
#: Concurrent listings when a batch's children are measured (one listing each).
CHILD_LISTINGS = 16


def capacity_of(entry: Mapping[str, Any]) -> str:
    """The entry's ``capacity``; absent (jobs from before capacity kinds): ``spot``
    for a ``:spot`` accelerator, else ``on-demand``."""
    capacity = entry.get("capacity")
    if isinstance(capacity, str) and capacity:
        return capacity
    return "spot" if str(entry.get("accelerator") or "").endswith(":spot") else DEFAULT_CAPACITY


def accelerator_facts(text: str) -> dict[str, Any]:
    """``{accelerator, family, chips, hosts}`` of an accelerator string: the name a
    person reads (``tpu-v6e-8``, ``gpu-h100x8``, ``cpu``; the capacity is said
    apart), the price table's family (None for CPUs: they have no chips), chips over
    all hosts and hosts.  Unparseable (a catalog change): the text, chips unknown."""
    try:
        accel = parse_accelerator(text)
    except (InvalidAcceleratorError, ValueError):
        return dict(accelerator=text.removesuffix(":spot"), family=None, chips=None, hosts=None)
    if accel.kind == "tpu":
        name = f"tpu-{accel.name}-{accel.count}"
    elif accel.kind == "gpu":
        name = f"gpu-{accel.name}x{accel.count}"
    else:
        name = "cpu"
    family = None if accel.kind == "cpu" else f"{accel.kind}-{accel.name}"
    chips = accel.count if accel.kind != "cpu" else 0
    return {"accelerator": name, "family": family, "chips": chips, "hosts": accel.num_nodes}


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else history.now_iso(epoch)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start), 3)


def _result_time(objects: Mapping[str, tuple[int, float]], job_id: str) -> float | None:
    times = [objects[f"{job_id}/{n}"][1] for n in RESULT_NAMES if f"{job_id}/{n}" in objects]
    return max(times) if times else None


def _base(entry: Mapping[str, Any]) -> dict[str, Any]:
    accel = accelerator_facts(str(entry.get("accelerator") or "cpu"))
    slices = entry.get("num_slices")
    if isinstance(slices, int) and slices > 1:  # a multi-slice job holds every slice's chips
        for key in ("chips", "hosts"):
            accel[key] = None if accel[key] is None else accel[key] * slices
    return {
        "job_id": entry["job_id"],
        "kind": entry.get("kind", "job"),
        **{key: entry.get(key) for key in IDENTITY},
        "state": entry.get("state"),
        **accel,
        "capacity": capacity_of(entry),
        "submitted_at": entry.get("submitted_at"),
        "admitted_at": entry.get("admitted_at"),
        "failure_class": failure_class_of(entry),  # what failed, when it did
    }


def _timed(
    out: dict[str, Any],
    submitted: float | None,
    admitted: float | None,
    started: float | None,
    run_s: float | None,
) -> None:
    """Fill in queued time (split at admission where known) and chip-hours."""
    out["queued_s"] = _span(submitted, started)
    known = admitted is not None and started is not None
    out["admission_wait_s"] = _span(submitted, admitted) if known else None
    out["start_wait_s"] = _span(admitted, started) if known else None
    out["run_s"] = run_s
    chips = out.get("chips")
    out["chip_hours"] = None if run_s is None or chips is None else chips * run_s / 3600.0


def _single(store: ObjectStore, entry: Mapping[str, Any], live: bool, now: float) -> dict:
    job_id, state = entry["job_id"], entry.get("state")
    objects = stat_objects(store, f"{job_id}/") if live else {}
    record = read_started(store, f"{job_id}/") if f"{job_id}/{STARTED_NAME}" in objects else None
    started = record.get("started_at") if record else None
    started = float(started) if isinstance(started, int | float) else None
    started = started if started is not None else history.iso_epoch(entry.get("started_at"))
    result_at = _result_time(objects, job_id)
    ended = result_at or history.iso_epoch(entry.get("ended_at"))
    if ended is None and state in history.ENDED and objects:
        ended = max(mtime for _, mtime in objects.values())
    running = ended is None and state not in history.ENDED
    submitted = history.iso_epoch(entry.get("submitted_at"))
    out = _base(entry)
    preempted = state == "PREEMPTED"
    out.update(
        started_at=_iso(started),
        ended_at=_iso(ended),
        jobs=1,
        running=running,
        preempted=preempted,
        preemptions=int(preempted),
    )
    ran = started is not None or result_at is not None or state == "SUCCEEDED"
    never_ran = not ran and ended is not None and bool(objects)
    if started is not None:
        run_s = _span(started, now if running else ended)
    else:  # never ran (no start record, no result, artifacts there): it held nothing
        run_s = 0.0 if never_ran else None
    out["measured_jobs"] = int(run_s is not None)
    _timed(out, submitted, history.iso_epoch(entry.get("admitted_at")), started, run_s)
    if never_ran:  # it waited until it ended
        out["queued_s"] = _span(submitted, ended)
    return out


def _child(store: ObjectStore, job_id: str) -> dict[str, float | None]:
    """A batch child's times from one listing of ``{job_id}/`` (write times only)."""
    objects = stat_objects(store, f"{job_id}/")
    at = {key.rsplit("/", 1)[1]: mtime for key, (_, mtime) in objects.items()}
    started, ended = at.get(STARTED_NAME), _result_time(objects, job_id)
    run_s = _span(started, ended)
    if run_s is None and objects and started is None and ended is None:
        run_s = 0.0  # created, never started, no result: it held nothing
    return {"submitted": at.get(HANDLE_NAME), "started": started, "ended": ended, "run_s": run_s}


def _batch(store: ObjectStore, entry: Mapping[str, Any], live: bool) -> dict[str, Any]:
    """A batch: its children's times summed (queued and run seconds are job-seconds,
    children run side by side).  Children are known once the batch ended
    (``child_jobs``); before, and where their artifacts went before anyone recorded
    the usage, the batch is unmeasured."""
    children = [str(c) for c in entry.get("child_jobs") or []] if live else []
    with ThreadPoolExecutor(max_workers=CHILD_LISTINGS) as pool:
        times = list(pool.map(lambda job_id: _child(store, job_id), children))
    out = _base(entry)
    measured = [t for t in times if t["run_s"] is not None]
    queued = [q for t in times if (q := _span(t["submitted"], t["started"])) is not None]
    starts = [t["started"] for t in times if t["started"] is not None]
    ends = [t["ended"] for t in times if t["ended"] is not None]
    preemptions = entry.get("preemptions")
    run_s = round(sum(t["run_s"] or 0.0 for t in measured), 3) if measured else None
    out.update(
        started_at=_iso(min(starts) if starts else None),
        ended_at=_iso(max(ends) if ends else None) or entry.get("ended_at"),
        jobs=len(children) or int(entry.get("total") or 0),
        measured_jobs=len(measured),
        running=entry.get("state") not in history.ENDED,
        preemptions=preemptions if isinstance(preemptions, int) else 0,
        preempted=bool(preemptions),
        queued_s=round(sum(queued), 3) if queued else None,
        admission_wait_s=None,
        start_wait_s=None,
        run_s=run_s,
    )
    chips = out.get("chips")
    out["chip_hours"] = None if run_s is None or chips is None else chips * run_s / 3600.0
    return out


def job_usage(
    store: ObjectStore, entry: Mapping[str, Any], *, live: bool = True, now: float | None = None
) -> dict[str, Any]:
    """One job's (one attempt's) or one batch's usage, from its history entry: the
    usage frozen into it when it ended, else measured now (``live``: read the job's
    artifacts, one listing and at most one read; a batch, one listing per child.
    ``live=False``: the entry alone, for pages that show many rows).

    Keys: ``job_id, kind, dag_id, task_id, run_id, map_index, try_number, state,
    accelerator, family, capacity, chips, hosts, jobs, measured_jobs, submitted_at,
    admitted_at, started_at, ended_at, queued_s, admission_wait_s, start_wait_s,
    run_s, chip_hours, preempted, preemptions, running, failure_class`` (times ISO UTC, spans in
    seconds; None where unknown).  JSON-serialisable."""
    recorded = entry.get("usage")
    if isinstance(recorded, Mapping) and recorded.get("job_id") == entry.get("job_id"):
        current = {key: entry.get(key) for key in (*IDENTITY, "state")}
        return {**recorded, **current, "failure_class": failure_class_of(entry)}
    if entry.get("kind") == "batch":
        return _batch(store, entry, live)
    return _single(store, entry, live, time.time() if now is None else now)


def record_usage(store: ObjectStore, job_id: str) -> dict[str, Any] | None:
    """Freeze an ended job's (or batch's) usage into its history entry, so readers
    after the cleanup (which deletes ``{job_id}/`` with the start record) show the
    same numbers.  Call it once the entry says how the job ended and before its
    artifacts go (a batch: once ``child_jobs`` is written).  Already frozen, not ended
    or no entry: nothing written.  Never raises (history never fails a job)."""
    try:
        entry = history.read(store, job_id)
        if entry is None or entry.get("state") not in history.ENDED:
            return None
        usage = job_usage(store, entry)
        if not isinstance(entry.get("usage"), Mapping):
            frozen = {k: v for k, v in usage.items() if k not in IDENTITY and k != "state"}
            history.update(store, job_id, create=False, usage=frozen)
        return usage
    except Exception as exc:  # noqa: BLE001 - usage is for people; the job goes on
        log.warning("could not record the usage of kinetic job %s: %s", job_id, exc)
        return None


def note_admitted(store: ObjectStore, job_id: str, at_epoch: float) -> None:
    """Record when Kueue admitted the job (its first admission: a job evicted and
    admitted again keeps the first, so its wait for nodes after that counts as start
    wait).  Batch children have no entry of their own: nothing is written for them.
    Never raises."""
    try:
        entry = history.read(store, job_id)
        if entry is None or entry.get("admitted_at"):
            return
        history.update(store, job_id, create=False, admitted_at=history.now_iso(at_epoch))
    except Exception as exc:  # noqa: BLE001 - history never fails a job
        log.warning("could not note the admission of kinetic job %s: %s", job_id, exc)


def price_for(prices: PriceTable, family: str | None, capacity: str) -> float | None:
    """USD per chip-hour of ``family`` on ``capacity``: its exact row
    (``reservation:r1``), else its kind's (``reservation``), else the family's ``*``."""
    rows = prices.get(family or "") or {}
    for key in (capacity, capacity.split(":", 1)[0], "*"):
        if key in rows:
            return float(rows[key])
    return None


def total(usages: Iterable[Mapping[str, Any]], prices: PriceTable | None = None) -> dict:
    """Attempts summed (oldest first; "the" accelerator and capacity are the last
    attempt's, ``capacities`` breaks chip-hours down per capacity).  With ``prices``,
    ``cost`` (USD, priced attempts) and ``unpriced_chip_hours``; without, neither."""
    detail = sorted((dict(u) for u in usages), key=lambda u: str(u.get("submitted_at") or ""))
    last = detail[-1] if detail else {}
    capacities: dict[str, dict[str, Any]] = {}
    for u in detail:
        cap = capacities.setdefault(u["capacity"], {"attempts": 0, "chip_hours": 0.0, "run_s": 0.0})
        cap["attempts"] += 1
        cap["chip_hours"] += u.get("chip_hours") or 0.0
        cap["run_s"] += u.get("run_s") or 0.0
    unmeasured = sum(int(u.get("jobs") or 0) - int(u.get("measured_jobs") or 0) for u in detail)
    out: dict[str, Any] = {
        "accelerator": last.get("accelerator"),
        "family": last.get("family"),
        "capacity": last.get("capacity"),
        "capacities": capacities,
        "attempts": len(detail),
        "jobs": sum(int(u.get("jobs") or 0) for u in detail),
        "unmeasured_jobs": unmeasured,
        "running": sum(bool(u.get("running")) for u in detail),
        "preemptions": sum(int(u.get("preemptions") or 0) for u in detail),
        "chip_hours": sum(u.get("chip_hours") or 0.0 for u in detail),
        "run_s": round(sum(u.get("run_s") or 0.0 for u in detail), 3),
        "queued_s": round(sum(u.get("queued_s") or 0.0 for u in detail), 3),
    }
    if failures := lost_to_failures(detail):  # what each failure class cost
        out["failures"] = failures
    if prices is not None:
        cost, unpriced = 0.0, 0.0
        for u in detail:
            hours = u.get("chip_hours") or 0.0
            price = price_for(prices, u.get("family"), u["capacity"])
            u["cost"] = None if price is None or not hours else round(hours * price, 4)
            cost += u["cost"] or 0.0
            unpriced += hours if price is None else 0.0
        out["cost"], out["unpriced_chip_hours"] = round(cost, 4), unpriced
    out["attempts_detail"] = detail
    return out


def for_jobs(
    store: ObjectStore,
    job_ids: Iterable[str],
    prices: PriceTable | None = None,
    *,
    record: bool = True,
    now: float | None = None,
) -> dict[str, Any]:
    """A task's usage: its attempts (``job_ids``: every job and batch it created, in any
    order; each read from its history entry) summed by :func:`total`.  With ``record``,
    each ended attempt's usage is frozen into its entry (:func:`record_usage`) on the
    way.  Ids without an entry are listed in ``missing``.  JSON-serialisable: it is the
    ``kinetic_usage`` XCom."""
    usages, missing = [], []
    for job_id in dict.fromkeys(job_ids):
        entry = history.read(store, job_id)
        if entry is None:
            missing.append(job_id)
            continue
        frozen = record_usage(store, job_id) if record else None
        usages.append(frozen or job_usage(store, entry, now=now))
    out = total(usages, prices)
    if missing:
        out["missing"] = missing
    return out


def summary_line(usage: Mapping[str, Any]) -> str:
    """One line for the task log, e.g. ``tpu-v6e-8 on spot: 1.9 chip-hours over 2
    attempts, 14 min queued``; CPU jobs have no chips and say hours instead.  Adds, when
    there are any: the chip-hours per capacity, preemptions, failures per class (with the
    chip-hours they lost), jobs (a batch's children), jobs nobody measured or still
    running, and the estimated cost with what the price table does not price."""
    attempts, jobs = int(usage.get("attempts") or 0), int(usage.get("jobs") or 0)
    if usage.get("family") is None:
        held = f"{amount((usage.get('run_s') or 0.0) / 3600)} hours"
    else:
        held = f"{amount(usage.get('chip_hours') or 0.0)} chip-hours"
        capacities = usage.get("capacities") or {}
        if len(capacities) > 1:
            each = (f"{amount(c['chip_hours'])} on {name}" for name, c in capacities.items())
            held += f" ({', '.join(each)})"
    over = plural(attempts, "attempt") + (f" ({plural(jobs, 'job')})" if jobs > attempts else "")
    head = f"{usage.get('accelerator') or '?'} on {usage.get('capacity') or '?'}"
    parts = [f"{head}: {held} over {over}", f"{wait(usage.get('queued_s') or 0.0)} queued"]
    if usage.get("preemptions"):
        parts.append(plural(int(usage["preemptions"]), "preemption"))
    if usage.get("failures"):  # chip-hours lost to each failure class
        parts.append(lost_line(usage["failures"]))
    if usage.get("unmeasured_jobs"):
        parts.append(f"{usage['unmeasured_jobs']} without a recorded run time")
    if usage.get("running"):
        parts.append(f"{usage['running']} still running")
    if "cost" in usage:
        cost = f"est. ${usage['cost']:,.2f}"
        if usage.get("unpriced_chip_hours"):
            cost += f" + {amount(usage['unpriced_chip_hours'])} chip-hours not in the price table"
        parts.append(cost)
    return ", ".join(parts)
