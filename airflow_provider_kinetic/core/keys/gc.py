"""What keys hold, for ``data gc``: expiry, and the content hashes a live key keeps.

A key's every *kept* version protects its content (a pinned ``key@version`` must
stay readable); versions cut from the history, and keys past their ttl, do not.
Expiry is a compare-and-swap delete of the pointer, so a put that lands meanwhile
(which renews the ttl) wins and the key stays.
"""

from __future__ import annotations

import time

from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import pointer_key
from airflow_provider_kinetic.core.keys.records import KeyState
from airflow_provider_kinetic.core.storage import PreconditionFailed
from airflow_provider_kinetic.core.storage.swap import read_versioned, swap


def expire(keys: KeyStore, now: float | None = None, dry_run: bool = False) -> list[KeyState]:
    """Remove keys past their ttl; returns the expired states (removed unless
    ``dry_run``)."""
    now = time.time() if now is None else now
    gone = []
    for key in keys.names():
        obj = pointer_key(key)
        data, token = read_versioned(keys.store, obj)
        if data is None:
            continue
        state = KeyState.from_bytes(data)
        if not state.expired(now):
            continue
        if not dry_run:
            try:
                swap(keys.store, obj, None, token)
            except PreconditionFailed:
                continue  # put again meanwhile: alive
        gone.append(state)
    return gone


def referenced_hashes(keys: KeyStore, now: float | None = None) -> set[str]:
    """Content hashes of every kept version of every live (unexpired) key."""
    now = time.time() if now is None else now
    return {v.version for st in keys.states() if not st.expired(now) for v in st.versions}
