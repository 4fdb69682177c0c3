"""``KineticMapOperator(..., broadcast=True)``: the batch's shared ``Data`` travels
as a tree (``broadcast.py``) instead of every child reading the store.

The operator puts the window in the children's env (``DATA_ENV``, JSON); the
runner's download of a Data input asks :func:`wanted` and, for a data-cache entry
of the job's own store (``default/data-cache/{hash}``: a content hash to verify
against), fetches it with :func:`get_data`.  The broadcast's group is the content
hash, so every child needing the same bytes meets in one tree, and different Data
inputs make different trees.  A ``gs://`` Data of the user's own has no content
hash to check a peer's copy against, so it is read from the store as before.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.data.schemes.base import create_empty_dirs
from airflow_provider_kinetic.core.data.schemes.download import expected_hash
from airflow_provider_kinetic.core.keys import env
from airflow_provider_kinetic.core.keys.broadcast import Broadcast
from airflow_provider_kinetic.core.keys.fetch import KeyVerifyError
from airflow_provider_kinetic.core.keys.peer.registry import PeerError, job_scope
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.keys.records import Version
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger("kinetic.peers")

#: The children's broadcast window (``BroadcastWindow.to_dict()`` as JSON).
DATA_ENV = "KINETIC_BROADCAST"


def window_of(value: object) -> BroadcastWindow | None:
    """The operator's ``broadcast=``: False/None (off), True (the default window) or
    a ``BroadcastWindow``; anything else is refused where the operator is made."""
    if value is None or value is False:
        return None
    if value is True:
        return BroadcastWindow()
    if isinstance(value, BroadcastWindow):
        return value
    raise TypeError(f"broadcast={value!r}: give True, False or a BroadcastWindow(fanout=...)")


def window_env(window: BroadcastWindow) -> dict[str, str]:
    """What the operator adds to its children's env."""
    return {DATA_ENV: json.dumps(window.to_dict(), sort_keys=True)}


def wanted(ref: dict[str, Any]) -> tuple[ObjectStore, str, BroadcastWindow] | None:
    """``(store, content hash, window)`` when this Data input should come by
    broadcast; None: download it as usual."""
    raw = os.environ.get(DATA_ENV)
    if not raw or not env.in_job():
        return None
    try:
        job_scope()
    except PeerError:  # an unsigned job has no peer token: no peers
        log.info("broadcast asked for, but this job has no peer token: reading the store")
        return None
    store = env.job_store()
    uri = str(ref.get("uri", "")).rstrip("/")
    digest = expected_hash(uri)
    if digest is None or uri != store.uri(cache_key(digest)).rstrip("/"):
        return None
    return store, digest, BroadcastWindow.from_dict(json.loads(raw))


def get_data(
    ref: dict[str, Any],
    target: str,
    store: ObjectStore,
    digest: str,
    window: BroadcastWindow,
    report: Callable[[Broadcast], None] | None = None,
) -> str:
    """Fetch the data-cache entry ``digest`` into ``target`` by broadcast, verified;
    returns the path the function gets (a file ref's one file, else ``target``).
    ``report`` is shown the broadcast once done (where its bytes came from)."""
    v = Version(version=digest, epoch=0.0, size=0, files=0, kind="dir")

    def hashed(tmp: str) -> str:
        """What the content hash covers: a file ref's one file, else the tree."""
        names = [rel for rel, _ in cast.server.roots[digest].expected]
        one = not ref.get("is_dir") and len(names) == 1
        return os.path.join(tmp, names[0]) if one else tmp

    # No ``expected``: a Data has no record of its files but the store's listing,
    # which a child reads before it trusts a parent's list.
    group = window.group_id or f"data@{digest}"
    cast = Broadcast(store, v, group, window, f"data {digest[:12]}", target=hashed)
    target = os.path.abspath(target)
    tmp = f"{target}.{secrets.token_hex(6)}.kinetic-bcast"
    os.makedirs(tmp)
    try:
        cast.receive(tmp)
        names = [rel for rel, _ in cast.server.roots[digest].expected]
        one_file = not ref.get("is_dir") and len(names) == 1
        if not one_file:
            create_empty_dirs(ref, tmp)
        checked = os.path.join(tmp, names[0]) if one_file else tmp
        got = content_hash(checked, ref["uri"], None, cast.digests.lookup).hexdigest
        if got != digest:
            raise KeyVerifyError(
                f"data {ref['uri']}: the broadcast copy from {cast.source()} hashes to {got}, "
                f"not to {digest}; not used"
            )
        os.rename(tmp, target)
    except BaseException:
        cast.failed()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    cast.placed(target)
    if report is not None:
        report(cast)
    log.info(
        "data %s: %d file(s) by broadcast from %s, verified",
        digest[:12],
        len(names),
        ", ".join(cast.sources),
    )
    return os.path.join(target, names[0]) if one_file else target
