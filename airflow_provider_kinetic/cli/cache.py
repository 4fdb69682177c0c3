"""``airflow kinetic cache ls|rm``: the reusable results of ``cache=True`` tasks.

``ls`` lists each entry (``core.jobs.resultcache``): its key, the job that produced
the result and its task run, the output dir, when it was made and when
``[kinetic] cache_retention_days`` lets it go, and whether its result is still
stored.  ``rm KEY...`` (a unique prefix is enough) or ``rm --all`` drops entries:
the next identical task runs its job again; each dropped entry's job artifacts go
too unless something else holds them (the same check as ``jobs cleanup``: an XCom
reference, another entry).
"""

from __future__ import annotations

import time
from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.cli.cleanup import DAY, Cleaner, retention_days
from airflow_provider_kinetic.cli.common import CliError, command, output_format
from airflow_provider_kinetic.cli.output import emit
from airflow_provider_kinetic.core.jobs import history, resultcache
from airflow_provider_kinetic.hooks.kinetic import KineticHook

COLUMNS = ("key", "job_id", "dag_id", "run_id", "task_id", "created_at", "expires_at", "result")
RM_COLUMNS = ("key", "job_id", "action")


def _retention_s() -> float:
    return retention_days("cache_retention_days", resultcache.CACHE_RETENTION_DAYS) * DAY


@command
def cache_ls(args: Namespace) -> None:
    """List the cache's entries, newest first."""
    store = KineticHook(args.conn_id).get_store()
    keep_s, now = _retention_s(), time.time()
    rows: list[dict[str, Any]] = []
    for entry in resultcache.entries(store):
        if args.dag_id and entry.producer.get("dag_id") != args.dag_id:
            continue
        rows.append(
            {
                "key": entry.key if output_format(args) == "json" else entry.key[:12],
                "job_id": entry.job_id,
                **{k: entry.producer.get(k) for k in ("dag_id", "run_id", "task_id")},
                "map_index": entry.producer.get("map_index"),
                "func": entry.func,
                "cache_version": entry.cache_version,
                "output_dir": entry.output_dir,
                "created_at": entry.created_at,
                "expires_at": entry.expires_at(keep_s),
                "expired": entry.expired(now, keep_s),
                "result": "stored" if resultcache.usable(store, entry) else "missing",
            }
        )
    emit(rows, output_format(args), COLUMNS)


@command
def cache_rm(args: Namespace) -> None:
    """Drop entries (KEY prefixes, or --all), and their jobs' artifacts unless held."""
    if bool(args.keys) == bool(args.all):
        raise CliError("give KEY... (a unique prefix is enough) or --all")
    cleaner = Cleaner(Namespace(conn_id=args.conn_id, force=False, dry_run=args.dry_run))
    found = resultcache.entries(cleaner.store)
    chosen = found if args.all else [_one(found, prefix) for prefix in args.keys]
    rows = []
    for entry in chosen:
        if not args.dry_run:
            resultcache.remove(cleaner.store, entry.key)
        action = "would delete" if args.dry_run else "deleted"
        rows.append({"key": entry.key, "job_id": entry.job_id, "action": action})
    # The artifacts go once no entry (nor an XCom, ...) holds them: the holds are read
    # again without the dropped entries.
    if not args.dry_run:
        cleaner = Cleaner(Namespace(conn_id=args.conn_id, force=False, dry_run=False))
    for entry in chosen:
        cleaner.artifacts(entry.job_id, history.read(cleaner.store, entry.job_id))
    emit([*rows, *cleaner.rows], output_format(args), RM_COLUMNS + ("held_by",))


def _one(found: list[resultcache.CacheEntry], prefix: str) -> resultcache.CacheEntry:
    matches = [e for e in found if e.key.startswith(prefix)]
    if len(matches) != 1:
        what = "no entry" if not matches else f"{len(matches)} entries"
        raise CliError(f"cache key {prefix!r}: {what} (see airflow kinetic cache ls)")
    return matches[0]
