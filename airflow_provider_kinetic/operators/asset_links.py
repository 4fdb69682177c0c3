"""Which run may add a stable asset's event through an alias (``operators/assets``).

Airflow links an alias to an asset at the first event the alias carries for it, in
the API server's transaction that ends the task: it reads the asset's links, then
inserts the missing one.  Two such first events at once fail one of the two tasks
(``IntegrityError: UNIQUE constraint failed: asset_alias_asset``; apache/airflow
3.3.2 ``assets/manager.py``, ``_add_asset_alias_association``, and the execution
API marks the task failed on it).  Once one event is committed, later ones find the
link, however many run at once.

So one task instance at a time is the *linker* of an (alias, asset) pair, named in
a small object in the store (``_airflow/assetlinks/{digest}.json``, moved only by
compare-and-swap, ``core/storage/swap``).  A run adds the asset's event through the
alias when (:func:`decide`):

1. no linker is named and its own name lands first (of concurrent runs, one does);
2. it is the named linker (a later try of the same task instance);
3. the linker's task instance has succeeded: its success committed the link;
4. the linker's task instance is gone or ended without success (its claim is void):
   its own name replaces it, by the same swap.

Otherwise (the linker is running, deferred, queued or up for retry: its event may be
in flight) the run asks again every ``poll_s`` for up to ``wait_s``: a linker claims
only at its last steps, so runs that end together (a backfill's first wave) wait a
second or two and then use the alias too.  Past ``wait_s`` the run uses another way
that touches no shared link (the caller's fallback), and a later run finds the link.
An unreadable state counts as in flight.

The object's holder is the link in Airflow's database, which Airflow never removes:
no cleanup, gc or retention of this provider deletes ``_airflow/assetlinks/``
(docs/ARCHITECTURE.md, liveness).  A task instance marked success by hand while it
was the linker, before its event, would make a later run trust a link that is not
there (and two such runs at once could meet the race above): the one case left.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from airflow_provider_kinetic.core.storage.base import ObjectStore, PreconditionFailed
from airflow_provider_kinetic.core.storage.swap import read_versioned, swap

#: Where the linker objects live (one per alias and asset).
LINKS_PREFIX = "_airflow/assetlinks"
#: Task states in which a linker surely committed no event (or never will): its claim
#: is void.  ``None``: the task instance is gone (its run deleted, a new database).
VOID_STATES = frozenset({None, "failed", "upstream_failed", "skipped", "removed"})
#: Compare-and-swap rounds before a run gives up (another run moved the object each
#: time): it then counts the link as in flight.
ROUNDS = 3


@dataclass(frozen=True)
class Linker:
    """A task instance (not a try: a later try of it is the same linker)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    def describe(self) -> str:
        index = "" if self.map_index < 0 else f"[{self.map_index}]"
        return f"{self.dag_id}.{self.task_id}{index} of run {self.run_id}"


@dataclass(frozen=True)
class LinkDecision:
    """Whether this run adds the event through the alias, and why (for the log)."""

    via_alias: bool
    reason: str


def link_key(alias_name: str, asset_uri: str) -> str:
    """The linker object's store key for an (alias, asset) pair."""
    digest = hashlib.sha256(f"{alias_name}\n{asset_uri}".encode()).hexdigest()[:32]
    return f"{LINKS_PREFIX}/{digest}.json"


def decide(
    store: ObjectStore,
    alias_name: str,
    asset_uri: str,
    me: Linker,
    state_of: Callable[[Linker], str | None],
    wait_s: float = 0.0,
    poll_s: float = 0.5,
) -> LinkDecision:
    """The steps in the module's order, asked again while the linker is in flight,
    for up to ``wait_s``; ``state_of`` reads a task instance's state from Airflow (it
    may raise: then the linker counts as in flight)."""
    deadline = time.monotonic() + wait_s
    while True:
        decision = _decide_once(store, alias_name, asset_uri, me, state_of)
        if decision.via_alias or time.monotonic() >= deadline:
            return decision
        time.sleep(poll_s)


def _decide_once(
    store: ObjectStore,
    alias_name: str,
    asset_uri: str,
    me: Linker,
    state_of: Callable[[Linker], str | None],
) -> LinkDecision:
    key = link_key(alias_name, asset_uri)
    for _ in range(ROUNDS):
        data, token = read_versioned(store, key)
        if data is None:
            if _claim(store, key, me, alias_name, asset_uri, token):
                return LinkDecision(True, "the first event through the alias links it")
            continue
        linker = _linker(data)
        if linker == me:
            return LinkDecision(True, "this task instance links it")
        who = linker.describe() if linker is not None else "an unreadable linker record"
        try:
            state = state_of(linker) if linker is not None else None
        except Exception as exc:  # noqa: BLE001 (the decision, not the task, fails)
            return LinkDecision(False, f"the state of {who} is unknown: {exc}")
        if state == "success":
            return LinkDecision(True, f"linked by {who}")
        if state not in VOID_STATES:
            return LinkDecision(False, f"{who} ({state}) may be adding its first event now")
        if _claim(store, key, me, alias_name, asset_uri, token):
            return LinkDecision(True, f"{who} ended {state}: this run links it")
    return LinkDecision(False, "other runs moved the linker record meanwhile")


def _claim(
    store: ObjectStore, key: str, me: Linker, alias_name: str, asset_uri: str, token: str
) -> bool:
    body = {"alias": alias_name, "asset": asset_uri, "linker": asdict(me)}
    try:
        swap(store, key, json.dumps(body, sort_keys=True).encode(), token)
    except PreconditionFailed:
        return False
    return True


def _linker(data: bytes) -> Linker | None:
    try:
        return Linker(**json.loads(data)["linker"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: never equal to a run, its state None (void)
