"""The Kinetic page's keys list (``/kinetic/keys``): every key with its kept versions,
newest first, and who wrote each (a DAG task, a job, or user@host).

Why a page of its own, not columns of the jobs list: a key outlives the jobs that
wrote it and one key has many versions; the list reads the key states (one object
per key, ``core/keys``) and nothing else.  Every value is escaped (``views.page``).
"""

from __future__ import annotations

from html import escape
from typing import Any

from airflow_provider_kinetic.cli.output import human_bytes
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.records import KeyState, iso
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.plugins.views import _link, page

COLUMNS = ("Key", "Version", "Time", "Size", "Files", "By")


def who(by: dict[str, Any]) -> str:
    """A version's writer as one line: dag / run / task [map index], the job, or
    user@host."""
    parts = []
    if by.get("dag_id") or by.get("task_id"):
        task = [str(by.get(k) or "?") for k in ("dag_id", "run_id", "task_id")]
        mi = by.get("map_index")
        if mi not in (None, -1, "-1"):
            task.append(f"[{mi}]")
        parts.append(" / ".join(task))
    if by.get("job_id"):
        index = f" [{by['group_index']}]" if by.get("group_index") is not None else ""
        parts.append(f"job {by['job_id']}{index}")
    if by.get("user"):
        parts.append(f"{by['user']}@{by.get('host') or '?'}")
    return "; ".join(parts) or "unknown"


def key_states(store: ObjectStore, prefix: str = "") -> list[KeyState]:
    """The keys under ``prefix`` that hold a version (sorted by key)."""
    return KeyStore(store).states(prefix)


def keys_page(states: list[KeyState], base: str, conn_id: str, prefix: str) -> str:
    """One row per kept version; a key's first row (its current version) names it."""
    head = "".join(f"<th>{h}</th>" for h in COLUMNS)
    body = []
    for state in states:
        expires = f" (expires {iso(state.expires_at)})" if state.expires_at is not None else ""
        for i, v in enumerate(state.versions):
            current = i == 0
            name = (
                f"<b>{escape(state.key)}</b><br><small>{len(state.versions)} version(s)"
                f"{escape(expires)}</small>"
                if current
                else ""
            )
            body.append(
                f"<tr data-key='{escape(state.key)}' data-version='{escape(v.version)}'"
                f" data-current='{str(current).lower()}'>"
                f"<td>{name}</td>"
                f"<td><code title='{escape(v.version)}'>{escape(v.version[:12])}</code>"
                f"{' (current)' if current else ''}</td>"
                f"<td>{escape(v.time)}</td>"
                f"<td data-bytes='{v.size}'>{escape(human_bytes(v.size))}</td>"
                f"<td>{v.files}</td><td class='by'>{escape(who(v.by))}</td></tr>"
            )
    title = "Kinetic keys" + (f" under {prefix}" if prefix else "")
    empty = "" if states else "<p id='no-keys'>No keys in this store.</p>"
    back = _link(base, "/", conn_id)
    return page(
        title,
        f"<nav><a href='{escape(back)}'>Kinetic jobs</a></nav>"
        f"<h1>{escape(title)}</h1><p>Connection <code>{escape(conn_id)}</code></p>"
        f"<table id='keys'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
        f"</table>{empty}",
    )
