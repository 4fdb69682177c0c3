"""``store``: the public key API (``from airflow_provider_kinetic import store``).

Which store a call uses is decided here, where Airflow may be known:

- inside a kinetic job (any backend): the job's own store, from its environment
  (``core/keys/env.py``), no connection, no Airflow import (a pod has no Airflow);
- anywhere else (a DAG's Python task, a notebook, the CLI): the ``kinetic``
  connection's store (``conn_id=`` picks another), through ``KineticHook``, with
  ``[kinetic] store_keep_versions`` for the history length.

Who put a version: the job id and the task it ran for (its history entry) inside a
job; the running task instance's
dag/task/run/map index inside an Airflow task; else user@host.  Airflow is imported
only in the second branch, inside functions.
"""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.keys import broadcast as broadcast_mod
from airflow_provider_kinetic.core.keys import env, fetch
from airflow_provider_kinetic.core.keys import joblocal as locale_mod
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.keys.records import DEFAULT_KEEP, user_at_host
from airflow_provider_kinetic.core.keys.tensors import broadcast as tensor_broadcast
from airflow_provider_kinetic.core.keys.tensors import statedict as tensors
from airflow_provider_kinetic.core.keys.versions import ls_versions
from airflow_provider_kinetic.core.storage import ObjectStore

CONF_SECTION = "kinetic"
_IDENTITY = ("dag_id", "task_id", "run_id", "map_index")


def keep_versions() -> int:
    """``[kinetic] store_keep_versions`` (default 10, at least 1)."""
    from airflow.configuration import conf

    return max(1, conf.getint(CONF_SECTION, "store_keep_versions", fallback=DEFAULT_KEEP))


def airflow_who() -> dict[str, Any]:
    """The running task instance's identity, else user@host."""
    try:
        from airflow.sdk import get_current_context

        ti = get_current_context()["ti"]
    except Exception:  # noqa: BLE001 - not in a task (or an Airflow without the SDK)
        return user_at_host()
    who = {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id}
    who["map_index"] = getattr(ti, "map_index", -1)
    return who


def job_who(store: ObjectStore) -> dict[str, Any]:
    """Inside a job: its id (and batch index) and the task it ran for, from the job
    history entry its submitter wrote (just the id if that entry is not there)."""
    who = env.job_who()
    entry = history.read(store, who["job_id"]) or {}
    who.update({k: entry[k] for k in _IDENTITY if entry.get(k) is not None})
    return who


def key_store(conn_id: str | None = None) -> KeyStore:
    """The KeyStore a call made here uses (see the module docstring)."""
    if conn_id is None and env.in_job():
        store = env.job_store()
        return KeyStore(store, who=lambda: job_who(store))
    from airflow_provider_kinetic.hooks.kinetic import KineticHook

    hook = KineticHook() if conn_id is None else KineticHook(conn_id)
    return KeyStore(hook.get_store(), who=airflow_who, keep=keep_versions())


class Store:
    """Named, versioned data: ``put``, ``get``, ``ls``, ``rm`` (see
    ``docs/KEYS.md``).  Each call resolves its store (cheap: no network)."""

    def put(
        self,
        key: str,
        src: str | os.PathLike[str] | Any,
        *,
        ttl: str | float | None = None,
        conn_id: str | None = None,
        locale: str = "store",
    ) -> dict[str, Any]:
        """Make ``src`` (a file or directory, or a torch tensor or state dict, stored
        as safetensors) ``key``'s new current version; returns its row (key, version,
        time, size, files, by, uploaded).  ``ttl``: the key expires this long after
        its latest put ("7d"); None keeps the key's ttl.  ``locale="local"`` (inside a
        job only): nothing is uploaded; this job's runner serves ``src`` to its batch's
        peers until the job ends, or until ``ttl`` passes (``core/keys/joblocal.py``)."""
        if locale_mod.check_locale(locale) == "local":
            locale_mod.scope_or_refuse(f"put({key!r}, locale='local')")
            return locale_mod.put_local(key_store(conn_id), key, src, ttl=ttl)
        if tensors.is_tensors(src):
            return tensors.put(key_store(conn_id), key, src, ttl=ttl)
        return key_store(conn_id).put(key, src, ttl=ttl)

    def get(
        self,
        key: str,
        dest: str | os.PathLike[str] | Any,
        version: str | None = None,
        overwrite: bool = False,
        conn_id: str | None = None,
        broadcast: BroadcastWindow | None = None,
    ) -> dict[str, Any]:
        """Write ``key``'s current version (or ``version``, or ``key@version``) to
        ``dest``, every file verified against the hash.  A tensor or state dict
        ``dest`` is filled in place; with ``broadcast`` (world_size=N) one of a
        batch's N children reads the store and the rest receive through
        torch.distributed.  Inside a job, a key a peer published with
        ``locale="local"`` comes from that peer; ``broadcast=`` makes the batch's
        file getters a tree (``core/keys/broadcast.py``)."""
        if tensors.is_tensors(dest):
            if broadcast is not None:
                return tensor_broadcast.get(
                    key_store(conn_id), key, dest, version, broadcast, env.peer_scope()
                )
            return tensors.get(key_store(conn_id), key, dest, version)
        if broadcast is not None:  # refused outside a job before any store is asked
            locale_mod.scope_or_refuse(f"get({key!r}, broadcast=...)")
            return broadcast_mod.get_broadcast(
                key_store(conn_id), key, dest, version, overwrite, broadcast
            )
        keys = key_store(conn_id)
        local = locale_mod.get_local(keys, key, dest, version, overwrite) if env.in_job() else None
        if isinstance(local, dict):
            return local
        if isinstance(local, str):  # the local copy's version, read from the store
            version, key = local, key.partition("@")[0]
        return fetch.get(keys, key, dest, version, overwrite=overwrite)

    def ls(
        self, prefix: str = "", conn_id: str | None = None, versions: bool = False
    ) -> list[dict[str, Any]]:
        """Keys starting with ``prefix``: current version, size, files, time, who.
        Inside a job every row has a ``locale``: "store", or "local" (with the
        serving ``address``) for a key a peer of this job's scope published with
        ``locale="local"``; outside a job the rows are the store's, as the CLI shows.
        ``versions=True``: one row per kept version of each key, newest first, with
        ``current`` and ``pins`` (the task instances whose retries read it); the
        store's versions only (a local key has just the one its peer serves)."""
        keys = key_store(conn_id)
        in_job = conn_id is None and env.in_job()
        if versions:
            rows = ls_versions(keys, prefix)
            return [{**r, "locale": "store"} for r in rows] if in_job else rows
        rows = keys.ls(prefix)
        if not in_job:
            return rows
        local = locale_mod.ls_local(keys, prefix)
        rows = [{**r, "locale": "store"} for r in rows] + local
        return sorted(rows, key=lambda r: (r["key"], r["locale"] != "store"))

    def rm(
        self,
        key: str,
        version: str | None = None,
        recursive: bool = False,
        conn_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Remove one version, a key, or (``recursive``) every key under a prefix;
        returns the versions removed.  Content is collected later by ``data gc``."""
        return key_store(conn_id).rm(key, version, recursive=recursive)

    def __repr__(self) -> str:
        return "<airflow_provider_kinetic.store: put/get/ls/rm>"


store = Store()
