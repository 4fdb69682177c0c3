"""``airflow kinetic store put|get|ls|rm``: keys from a shell.

The same calls as ``from airflow_provider_kinetic import store``, on the store of
``--conn-id``; who put a version is user@host.  Tables for people, ``-o json`` for
scripts (one object for put/get, a list for ls/rm).  ``ls --versions`` lists every
kept version of each key (``core/keys/versions.py``).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.cli.common import command, output_format
from airflow_provider_kinetic.cli.output import emit, human_bytes
from airflow_provider_kinetic.core.keys import fetch
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.records import user_at_host
from airflow_provider_kinetic.core.keys.versions import ls_versions
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.keys import keep_versions

COLUMNS = ("key", "version", "time", "files", "size", "by")
#: A table's pins cell names this many task instances, then "+N".
PINS_SHOWN = 2


def _keys(args: Namespace) -> KeyStore:
    store = KineticHook(args.conn_id).get_store()
    return KeyStore(store, who=user_at_host, keep=keep_versions())


def _shown(row: dict[str, Any], output: str) -> dict[str, Any]:
    """The row for a table: a short hash, a human size, who as one word."""
    if output == "json":
        return row
    by = row.get("by") or {}
    who = "/".join(str(by[k]) for k in ("dag_id", "task_id", "run_id") if k in by)
    if not who:
        who = by.get("job_id") or f"{by.get('user', '?')}@{by.get('host', '?')}"
    return {**row, "version": row["version"][:12], "size": human_bytes(row["size"]), "by": who}


@command
def store_put(args: Namespace) -> None:
    """Make SRC the key's new current version (uploads only what the cache lacks)."""
    row = _keys(args).put(args.key, args.src, ttl=args.ttl)
    emit(_shown(row, output_format(args)), output_format(args))


@command
def store_get(args: Namespace) -> None:
    """Write the key's current version (or --version) to DEST, verified."""
    keys = _keys(args)
    row = fetch.get(keys, args.key, args.dest, args.version, overwrite=args.overwrite)
    emit(_shown(row, output_format(args)), output_format(args))


def _pins(row: dict[str, Any], output: str) -> dict[str, Any]:
    """A version row for a table: ``*`` on the current one, pins as dag/task/run."""
    if output == "json":
        return row
    named = [
        "/".join(str(p.get(k)) for k in ("dag_id", "task_id", "run_id"))
        + ("" if p.get("map_index") in (None, -1) else f"[{p['map_index']}]")
        for p in row["pins"]
    ]
    more = len(named) - PINS_SHOWN
    pins = ", ".join(named[:PINS_SHOWN]) + (f" +{more}" if more > 0 else "")
    return {**row, "current": "*" if row["current"] else "", "pins": pins}


@command
def store_ls(args: Namespace) -> None:
    """Keys under PREFIX with their current version (--versions: every kept one)."""
    out = output_format(args)
    if args.versions:
        rows = [_pins(_shown(r, out), out) for r in ls_versions(_keys(args), args.prefix)]
        emit(rows, out, (*COLUMNS, "current", "pins"))
        return
    rows = [_shown(r, out) for r in _keys(args).ls(args.prefix)]
    emit(rows, out, (*COLUMNS, "versions", "expires"))


@command
def store_rm(args: Namespace) -> None:
    """Remove a version, a key, or (--recursive) every key under a prefix."""
    out = output_format(args)
    rows = _keys(args).rm(args.key, args.version, recursive=args.recursive, dry_run=args.dry_run)
    action = "would remove" if args.dry_run else "removed"
    emit([{**_shown(r, out), "action": action} for r in rows], out, (*COLUMNS, "action"))
