"""Which jobs an XCom still needs, read from Airflow's metadata database.

``jobs cleanup`` keeps (unless ``--force``) the artifacts of a job that

- an XCom of a DAG run that has not finished names (a ``kinetic_job`` handle a
  downstream sensor will wait on, a ``kinetic_batch`` handle, a result reference), or
- a result reference of a DAG run that ended less than the retention ago points at
  (a cleared or backfilled downstream task loads its value from there).

Only XComs whose JSON text mentions a job or a result reference are read.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.cli.common import CliError
from airflow_provider_kinetic.core.jobs.holds import ARTIFACTS, BATCH, Holder, Holds, Ref
from airflow_provider_kinetic.core.jobs.resultref import REF_KEY


@dataclass
class Needed:
    """Job ids and batch (group) ids some XCom needs, each with why."""

    jobs: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)

    def why(self, job_id: str, group_id: str | None = None) -> str | None:
        found = self.jobs.get(job_id)
        if found is None and group_id:
            found = self.groups.get(group_id)
        return found

    def holds(self) -> Holds:
        """The same as ``core.jobs.holds`` holders: a job's artifacts, a batch (whose
        children it holds), each by the XCom that needs it."""
        out = Holds()
        for job_id, why in self.jobs.items():
            out.add(Ref(ARTIFACTS, job_id), Holder("xcom", why))
        for group_id, why in self.groups.items():
            out.add(Ref(BATCH, group_id), Holder("xcom", why))
        return out


def _decoded(value: Any) -> Any:
    for _ in range(3):  # the column may hold JSON text of JSON text
        if not isinstance(value, (str, bytes)):
            return value
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return value


def _mentions(value: Any, ref_too: bool, live: bool) -> Iterator[tuple[str, str, str]]:
    """``(kind, id, what)`` for each job or batch ``value`` names: result references
    always (``ref_too``), handles only for a run that has not finished (``live``)."""
    if isinstance(value, dict):
        if ref_too and isinstance(value.get(REF_KEY), str):
            parts = value[REF_KEY].rstrip("/").split("/")
            if len(parts) >= 2 and parts[-1] == "result.pkl":
                yield "job", parts[-2], "a result reference"
        if live and isinstance(value.get("job_id"), str) and "backend" in value:
            yield "job", value["job_id"], "a kinetic_job handle"
        if live and value.get("kind") == "kinetic_batch" and isinstance(value.get("group_id"), str):
            yield "group", value["group_id"], "a kinetic_batch handle"
        for item in value.values():
            yield from _mentions(item, ref_too, live)
    elif isinstance(value, list):
        for item in value:
            yield from _mentions(item, ref_too, live)


def needed(retention_s: float, now: float) -> Needed:
    """What XComs of unfinished DAG runs, or of runs ended within ``retention_s``,
    still need."""
    from airflow.models.xcom import XComModel
    from airflow.utils.state import DagRunState
    from sqlalchemy import String, cast
    from sqlalchemy.exc import SQLAlchemyError

    cutoff = dt.datetime.fromtimestamp(now - retention_s, dt.UTC)
    done = (DagRunState.SUCCESS, DagRunState.FAILED)
    text = cast(XComModel.value, String)
    out = Needed()
    try:
        _read(out, text, cutoff, done)
    except SQLAlchemyError as exc:
        raise CliError(
            "cannot read Airflow's metadata database to check which jobs XComs still need "
            f"({type(exc).__name__}: {str(exc).splitlines()[0]}); run it where Airflow's "
            "database is reachable, or pass --force to delete without that check"
        ) from None
    return out


def _read(out: Needed, text: Any, cutoff: dt.datetime, done: tuple) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import or_

    with create_session() as session:
        rows = (
            session.query(
                XComModel.value,
                XComModel.dag_id,
                XComModel.run_id,
                XComModel.task_id,
                DagRun.state,
            )
            .join(DagRun, DagRun.id == XComModel.dag_run_id)
            .filter(or_(DagRun.state.notin_(done), DagRun.end_date >= cutoff))
            .filter(or_(text.like("%job-%"), text.like(f"%{REF_KEY}%")))
        )
        for value, dag_id, run_id, task_id, state in rows.yield_per(500):
            live = state not in done
            where = f"{dag_id} / {run_id} / {task_id} (run {state})"
            for kind, ident, what in _mentions(_decoded(value), True, live):
                target = out.jobs if kind == "job" else out.groups
                target.setdefault(ident, f"{what} in an XCom of {where}")
