"""OpenLineage for Kinetic tasks: which data a job read, where it wrote, what it ran on.

``apache-airflow-providers-openlineage`` calls ``get_openlineage_facets_on_start`` /
``_on_complete(task_instance)`` / ``_on_failure(task_instance)`` on an operator when it
is installed and configured; these mixins answer for ``KineticRunOperator``,
``KineticMapOperator`` (through ``KineticOperatorBase``; ``@task.kinetic`` inherits
it) and the two sensors of "submit now, wait later".

What is read, and why from there:

* **inputs**: every ``Data`` in the task's arguments (``op_args``, ``op_kwargs``,
  ``inputs``, ``volumes``, at any depth), rendered (the listener runs after template
  rendering).  A local one carries kinetic's content hash, so lineage says which
  *version* of the data a model was trained on.  On complete it is the hash the job
  was packed with (``Data`` caches it per instance, and the task's ``Data`` objects
  are the ones packed), or, in a later process (a deferred task resumed elsewhere),
  hashed again and marked so (``hashedAt``); on start and on failure only a hash
  already known is used (hashing a large tree would delay the task, or repeat the
  error that failed it).
* **job facts** (ids, image, capacity, state, error): the task's sealed record in the
  store (``core.jobs.taskrecord``) and the job's history entry, not XCom: they hold
  the same facts in every process a task's segments ran in, and reading them makes
  no call through the task runner's supervisor, which the provider's default (a
  forked process per event) must not use (``store_of``).  A sensor without its
  store says what its handle says.
* **usage**: ``core.jobs.usage.for_jobs`` over the same jobs, without writing (the
  numbers the ``kinetic_usage`` XCom has, frozen in the history by then).

Everything OpenLineage is imported inside the methods (``lineage_facets``), so without
the OpenLineage provider nothing here costs an import.  Lineage never fails a task:
anything that goes wrong is logged and the event goes out with what was known.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.payload import data_found
from airflow_provider_kinetic.core.spec.handles import parse_rendered
from airflow_provider_kinetic.core.spec.identity import ti_identity
from airflow_provider_kinetic.operators.lineage_names import DataSet, hostname, named

log = logging.getLogger(__name__)

START, COMPLETE, FAIL = "start", "complete", "fail"
#: Input datasets per event at most (a map over 100,000 files would make an event of
#: many MB); the rest are counted in the run facet's ``omittedInputs``.
MAX_INPUTS = 500
#: Child job ids a batch's run facet lists (``childJobCount`` counts them all).
MAX_CHILD_IDS = 100
#: The usage summary's keys a run facet carries (not the per-attempt detail).
USAGE_KEYS = (
    "accelerator",
    "capacity",
    "capacities",
    "attempts",
    "jobs",
    "unmeasured_jobs",
    "running",
    "preemptions",
    "chip_hours",
    "run_s",
    "queued_s",
    "cost",
    "unpriced_chip_hours",
)


@dataclass
class TaskLineage:
    """What one event says: inputs, outputs, the ``kinetic`` run facet, an error."""

    inputs: list[DataSet] = field(default_factory=list)
    outputs: list[DataSet] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


# ---- inputs --------------------------------------------------------------------------
def data_in(value: Any, argument: str) -> list[tuple[Data, str]]:
    """Every ``Data`` in ``value`` (lists, tuples, dicts at any depth), named by the
    top-level argument it sits in."""
    return [(data, argument) for data, _ in data_found(value, argument)]


def task_data(operator: Any) -> list[tuple[Data, str]]:
    """The ``Data`` of an operator's rendered arguments, in argument order."""
    found: list[tuple[Data, str]] = []
    for i, value in enumerate(getattr(operator, "op_args", None) or ()):
        found += data_in(value, f"op_args[{i}]")
    inputs = getattr(operator, "inputs", None)
    if isinstance(inputs, list | tuple):
        for i, value in enumerate(inputs):
            found += data_in(value, f"inputs[{i}]")
    for name in ("op_kwargs", "volumes"):
        mapping = getattr(operator, name, None)
        if isinstance(mapping, Mapping):
            for key, value in mapping.items():
                found += data_in(value, f"{name}[{key!r}]")
    return found


def input_sets(found: Iterable[tuple[Data, str]], phase: str) -> tuple[list[DataSet], int]:
    """One ``DataSet`` per distinct Data path (the first ``MAX_INPUTS``), with its
    content hash when the phase allows (see the module docstring); and how many
    distinct paths were left out."""
    out: dict[str, DataSet] = {}
    omitted: set[str] = set()
    for data, argument in found:
        if data.path in out or data.path in omitted:
            continue
        if len(out) >= MAX_INPUTS:
            omitted.add(data.path)
            continue
        known = getattr(data, "_hash", None)  # packed in this process: the hash it used
        item = DataSet(data.path, argument, known, "submit" if known else None)
        if known is None and phase == COMPLETE and _uploads(data):
            try:
                item.content_hash, item.hashed_at = data.content_hash(), "complete"
            except Exception as exc:  # noqa: BLE001 - gone or unreadable here: no hash
                log.info("kinetic lineage: no content hash for %s: %s", data.path, exc)
        out[data.path] = item
    return list(out.values()), len(omitted)


def _uploads(data: Data) -> bool:
    try:
        return bool(data.uploads)
    except Exception:  # noqa: BLE001 - an unknown scheme: not local data
        return False


# ---- the store: records, history, usage ---------------------------------------------
def store_of(operator: Any, handle: Mapping[str, Any] | None = None) -> Any:
    """The store the task used, or None when it cannot be had safely.

    Its own (``execute`` set it in this process), else a local root its handle names
    (no connection needed), else the connection's, but only when the provider runs
    us in a thread: by default it forks, and a connection lookup from the fork goes
    through the task runner's supervisor channel, which a fork must not use (under
    ``dag.test()`` it waits for a parent that waits for it)."""
    store = getattr(operator, "_store", None)
    if store is not None:
        return store
    root = (handle or {}).get("bucket_name") or (handle or {}).get("bucket")
    if (handle or {}).get("backend") == "local" and root and os.path.isdir(str(root)):
        from airflow_provider_kinetic.core.storage.local import LocalStore

        return LocalStore(str(root))
    from airflow.providers.openlineage.conf import execute_in_thread

    if not execute_in_thread():
        return None
    from airflow_provider_kinetic.hooks.kinetic import KineticHook

    return KineticHook(operator.kinetic_conn_id, read_only=True).get_store()


def usage_of(store: Any, job_ids: list[str]) -> dict[str, Any] | None:
    from airflow_provider_kinetic.core.jobs.usage import for_jobs

    try:  # the task-level summary (the per-attempt detail stays in the XCom)
        usage = for_jobs(store, job_ids, record=False)
        return {k: usage[k] for k in USAGE_KEYS if usage.get(k) is not None} or None
    except Exception as exc:  # noqa: BLE001 - an account, not the lineage
        log.info("kinetic lineage: no usage for %s: %s", ", ".join(job_ids), exc)
        return None


def job_facts(store: Any, handle: Mapping[str, Any], attempts: list[str]) -> dict[str, Any]:
    """The run facet's fields for one job (its handle dict) and the entry's state."""
    from airflow_provider_kinetic.core.jobs import history

    job_id = str(handle.get("job_id"))
    entry = (history.read(store, job_id) if store is not None else None) or {}
    facts = {
        "jobId": job_id,
        "jobIds": list(attempts) or [job_id],
        "backend": handle.get("backend") or entry.get("backend"),
        "accelerator": handle.get("accelerator") or entry.get("accelerator"),
        # The local backend runs no image (its handle names the default one anyway).
        "image": handle.get("image_uri") if handle.get("backend") != "local" else None,
        "capacity": handle.get("capacity") or entry.get("capacity"),
        "outputDir": handle.get("output_dir") or entry.get("output_dir"),
        "state": entry.get("state"),
        "reason": entry.get("reason"),
        "failure": entry.get("failure"),
        "usage": usage_of(store, list(attempts) or [job_id]) if store is not None else None,
    }
    return {k: v for k, v in facts.items() if v is not None}


def batch_facts(store: Any, group_id: str) -> dict[str, Any]:
    """The run facet's fields for one batch: its group, children, state and usage."""
    from airflow_provider_kinetic.core.jobs import history

    entry = (history.read(store, group_id) if store is not None else None) or {}
    children = [str(c) for c in entry.get("child_jobs") or []]
    facts = {
        "groupId": group_id,
        "backend": entry.get("backend"),
        "accelerator": entry.get("accelerator"),
        "capacity": entry.get("capacity"),
        "outputDir": entry.get("output_dir"),
        "childJobCount": len(children) or entry.get("total"),
        "childJobIds": children[:MAX_CHILD_IDS] or None,
        "children": entry.get("children"),
        "state": entry.get("state"),
        "reason": entry.get("reason"),
        "usage": usage_of(store, [group_id]) if store is not None else None,
    }
    return {k: v for k, v in facts.items() if v is not None}


def record_facts(operator: Any, task_instance: Any) -> dict[str, Any]:
    """This try's job or batch, from the task's record ({} when this try made none)."""
    from airflow_provider_kinetic.core.jobs.taskrecord import read_record
    from airflow_provider_kinetic.deployment.signing import deployment_secret

    store = store_of(operator)
    if store is None:
        return {}
    identity = ti_identity(task_instance)
    record = read_record(store, identity, deployment_secret())
    if record is None or record.try_number not in (None, identity["try_number"]):
        return {}  # none, or an earlier try's: this try failed before it had a job
    if record.kind == "batch" and record.group_id:
        return batch_facts(store, record.group_id)
    if record.handle:
        return job_facts(store, record.handle, list(record.attempts or []))
    return {}


def safely(facts: Callable[..., Any], *args: Any) -> Any:
    """``facts(*args)``, or None when the store cannot tell (the event still goes out,
    with the inputs and outputs the task itself names)."""
    try:
        return facts(*args)
    except Exception as exc:  # noqa: BLE001 - lineage never fails a task
        log.warning("kinetic lineage: no job facts: %s", exc)
        return None


# ---- assembling one event --------------------------------------------------------------
def finish(lineage: TaskLineage, facts: Mapping[str, Any], phase: str) -> TaskLineage:
    """Fold job facts in: the output dir they name, and on failure the job's error."""
    lineage.run.update(facts)
    out = facts.get("outputDir")
    if out and not any(o.uri == out for o in lineage.outputs):
        lineage.outputs = [DataSet(str(out), "output_dir")]
    ended_badly = facts.get("state") not in (None, "SUCCEEDED", "SUBMITTED", "RUNNING")
    what = f"batch {facts['groupId']}" if "groupId" in facts else f"job {facts.get('jobId')}"
    failure = facts.get("failure")
    if phase == FAIL and isinstance(failure, Mapping) and failure.get("class"):
        from airflow_provider_kinetic.core.spec.failure import Failure

        lineage.error = f"kinetic {what} {Failure.from_dict(failure).describe()}"
    elif phase == FAIL and ended_badly and facts.get("reason"):
        lineage.error = f"kinetic {what} {str(facts['state']).lower()}: {facts['reason']}"
    return lineage


def operator_lineage(operator: Any, task_instance: Any, phase: str) -> TaskLineage:
    """A run or map task's event (``KineticOperatorBase``)."""
    inputs, omitted = input_sets(task_data(operator), phase)
    lineage = TaskLineage(inputs=inputs)
    capacity = operator.capacity
    lineage.run = {
        "connId": operator.kinetic_conn_id,
        "accelerator": operator.accelerator_spec(),
        "capacity": ",".join(capacity) if isinstance(capacity, list | tuple) else capacity,
        "image": operator.container_image if isinstance(operator.container_image, str) else None,
        "omittedInputs": omitted or None,
    }
    if isinstance(operator.output_dir, str) and operator.output_dir:
        lineage.outputs = [DataSet(operator.output_dir, "output_dir")]
    if task_instance is None:
        return lineage
    return finish(lineage, safely(record_facts, operator, task_instance) or {}, phase)


def handle_of(value: Any) -> dict[str, Any]:
    """A sensor's handle as a dict: given as one, as JSON, as a rendered dict literal
    (Jinja renders a dict as Python), or a batch's bare group id."""
    if isinstance(value, str) and value.strip().startswith("{"):
        value = parse_rendered(value.strip())
    if isinstance(value, Mapping):
        return dict(value)
    return {"group_id": str(value).strip()}


class _LineageMixin:
    """The three methods the OpenLineage provider looks for; subclasses say what."""

    def _kinetic_lineage(self, task_instance: Any, phase: str) -> TaskLineage:
        raise NotImplementedError

    def _kinetic_event(self, task_instance: Any, phase: str) -> Any:
        from airflow_provider_kinetic.operators.lineage_facets import to_operator_lineage

        try:
            lineage = self._kinetic_lineage(task_instance, phase)
        except Exception as exc:  # noqa: BLE001 - lineage never fails a task
            log.warning("kinetic lineage: %s event without job facts: %s", phase, exc)
            lineage = TaskLineage()
        host = hostname()
        return to_operator_lineage(
            named(lineage.inputs, host), named(lineage.outputs, host), lineage.run, lineage.error
        )

    def get_openlineage_facets_on_start(self) -> Any:
        """Inputs and the requested target, before anything runs."""
        return self._kinetic_event(None, START)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs (with the hashes used), the output dir, the job's facts and usage."""
        return self._kinetic_event(task_instance, COMPLETE)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """As on complete, plus the job's error."""
        return self._kinetic_event(task_instance, FAIL)


class KineticTaskLineage(_LineageMixin):
    """OpenLineage for ``KineticOperatorBase`` (run and map operators, ``@task.kinetic``)."""

    def _kinetic_lineage(self, task_instance: Any, phase: str) -> TaskLineage:
        return operator_lineage(self, task_instance, phase)


class KineticJobSensorLineage(_LineageMixin):
    """OpenLineage for ``KineticJobSensor``: the job it waits for and its output dir."""

    def _kinetic_lineage(self, task_instance: Any, phase: str) -> TaskLineage:
        handle = handle_of(self.handle)  # type: ignore[attr-defined]
        lineage = TaskLineage(run={"connId": self.kinetic_conn_id})  # type: ignore[attr-defined]
        store = safely(store_of, self, handle) if task_instance is not None else None
        return finish(lineage, safely(job_facts, store, handle, []) or {}, phase)


class KineticBatchSensorLineage(_LineageMixin):
    """OpenLineage for ``KineticBatchSensor``: the batch it drives and its output dir."""

    def _kinetic_lineage(self, task_instance: Any, phase: str) -> TaskLineage:
        handle = handle_of(self.batch)  # type: ignore[attr-defined]
        lineage = TaskLineage(run={"connId": self.kinetic_conn_id})  # type: ignore[attr-defined]
        store = safely(store_of, self, handle) if task_instance is not None else None
        facts = safely(batch_facts, store, str(handle.get("group_id"))) or {}
        facts.setdefault("outputDir", handle.get("output_dir"))
        facts.setdefault("childJobCount", handle.get("total"))
        return finish(lineage, facts, phase)
