"""What ``data gc`` must keep: what the store holds (``core.jobs.holds``: live keys' kept
versions, pins, jobs and batches in the history) and cache entries XComs point to.

- **Jobs and batches in the history.**  A job's handle names the data-cache entries
  it reads (``data_hashes``: its local Data and its ``kinetic://`` versions), copied
  into its history entry at submit (``core/jobs/history.py``); a batch writes its
  own (shared and every input's) into its entry at its start.  While the entry is there
  (``jobs cleanup`` applies the history retention), a retry or a re-run of that job
  may read them again, so they stay.
- **XComs.**  A ``kinetic_job`` handle (its ``data_hashes``), the ``kinetic_keys``
  pins and a ``kinetic_output_key`` row name versions; a task cleared later reads
  through them.  Every such XCom the metadata database still holds keeps its
  hashes.  A database that cannot be read fails gc (``--force``: skip this check),
  as ``jobs cleanup`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from airflow_provider_kinetic.cli.common import CliError
from airflow_provider_kinetic.cli.xcomrefs import _decoded
from airflow_provider_kinetic.core.jobs.history import DATA_HASHES
from airflow_provider_kinetic.core.jobs.holds import DATA, Holder, Holds, Ref, store_holds
from airflow_provider_kinetic.core.storage import ObjectStore

#: XCom keys whose values name data-cache entries (``operators/keyio.py``, the handle).
XCOM_KEYS = ("kinetic_job", "kinetic_keys", "kinetic_output_key")


def hashes_in(value: Any) -> Iterator[str]:
    """Content hashes a handle, a pin list or a version row names."""
    if isinstance(value, dict):
        for h in value.get(DATA_HASHES) or ():
            yield str(h)
        if isinstance(value.get("version"), str) and isinstance(value.get("key"), str):
            yield value["version"]
        for item in value.values():
            if isinstance(item, dict | list):
                yield from hashes_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from hashes_in(item)


def xcom_holds() -> Holds:
    """What every XCom of ``XCOM_KEYS`` in Airflow's database holds (data by hash)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy.exc import SQLAlchemyError

    held = Holds()
    try:
        with create_session() as session:
            rows = session.query(
                XComModel.value,
                XComModel.key,
                XComModel.dag_id,
                XComModel.run_id,
                XComModel.task_id,
            ).filter(XComModel.key.in_(XCOM_KEYS))
            for value, key, dag_id, run_id, task_id in rows.yield_per(500):
                holder = Holder("xcom", f"XCom {key} of {dag_id} / {run_id} / {task_id}")
                for h in hashes_in(_decoded(value)):
                    held.add(Ref(DATA, h), holder)
    except SQLAlchemyError as exc:
        raise CliError(
            "cannot read Airflow's metadata database to check which data XComs still point "
            f"to ({type(exc).__name__}: {str(exc).splitlines()[0]}); run it where Airflow's "
            "database is reachable, or pass --force to skip that check"
        ) from None
    return held


def holds(store: ObjectStore, force: bool, now: float, retry_window_s: float) -> Holds:
    """Everything the store (history, batches, keys, pins) and, unless ``force``, the
    XComs hold (``core.jobs.holds``)."""
    held = store_holds(store, now, retry_window_s)
    if not force:
        held.merge(xcom_holds())
    return held
