"""The peer registry: which runners of a batch serve which content, in the store.

Why in the store: every job already has it (``GCS_BUCKET``), so peers of a batch find
each other with no extra service in the cluster.  One small object per *board* holds
every peer of it, moved by compare-and-swap (``storage/swap.py``), so joins get a
definite order (a broadcast tree is built from that order) and two peers joining at
once both land.

- A **scope** is what may talk to whom: the batch's group id (a batch's children) or
  the job id (a single job, all hosts of an LWS job).  Every job gets it as
  ``KINETIC_PEER_SCOPE`` (``env.peer_scope``), and a signed job a token for it as
  ``KINETIC_PEER_TOKEN`` (``peer_token``: an HMAC of the scope with the
  deployment's signing secret, made at submit time), which its server asks of every
  request: nothing outside the scope can read through a runner.
- A **board** is one name inside a scope: ``local/{key}`` for a key published with
  ``locale="local"``, ``bcast/{group}`` for one file broadcast, ``tensor/{group}``
  for one tensor broadcast's rendezvous (``tensors/rendezvous.py``).  Each entry is a
  :class:`Peer`: where it serves (``address``), which content (``version``, the
  content hash), its state (``receiving``: files appear as they complete;
  ``complete``; ``failed``) and its position in join order.

The tensor rendezvous sits on the same boards: ``join`` admits a peer (or refuses a
full quorum) in the same compare-and-swap that gives its position, its rank.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.spec.peerport import SCOPE_ENV, TOKEN_ENV
from airflow_provider_kinetic.core.storage import ObjectStore, PreconditionFailed
from airflow_provider_kinetic.core.storage.swap import ABSENT, read_versioned, swap

PEERS_PREFIX = "default/peers"
BOARD_NAME = "@peers.json"
MAX_SWAPS = 200
RECEIVING, COMPLETE, FAILED = "receiving", "complete", "failed"


class PeerError(KineticError, RuntimeError):
    """Peers cannot be used here (no scope or token: not inside a job)."""


def peer_token(secret: bytes, scope: str) -> str:
    """The token a scope's peers show each other (hex).  Derived, not stored: the
    submitter computes it from the deployment secret and hands it to each job."""
    return hmac.new(bytes(secret), b"kinetic-peer:" + scope.encode(), hashlib.sha256).hexdigest()


def job_scope() -> tuple[str, str]:
    """This job's ``(scope, token)``; ``PeerError`` outside a job started with them."""
    scope, token = os.environ.get(SCOPE_ENV, ""), os.environ.get(TOKEN_ENV, "")
    if not scope or not token:
        raise PeerError(
            f"peers need {SCOPE_ENV} and {TOKEN_ENV}, which a kinetic job gets at submit: "
            "locale='local' and broadcast work only inside a job"
        )
    return scope, token


def board_name(kind: str, name: str) -> str:
    """A board's name; a group id of any text becomes a safe object name."""
    safe = name if kind == "local" else hashlib.sha256(name.encode()).hexdigest()[:32]
    return f"{kind}/{safe}"


@dataclass
class Peer:
    """One runner on one board."""

    peer_id: str
    address: str
    version: str
    job_id: str = ""
    state: str = COMPLETE
    position: int = -1
    joined: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)


class PeerRegistry:
    """The boards of one scope in ``store``."""

    def __init__(self, store: ObjectStore, scope: str) -> None:
        self.store, self.scope = store, scope

    def _obj(self, board: str) -> str:
        return f"{PEERS_PREFIX}/{self.scope}/{board}/{BOARD_NAME}"

    def lookup(self, board: str, version: str | None = None) -> list[Peer]:
        """The board's peers in join order (only those of ``version`` if given)."""
        data, _ = read_versioned(self.store, self._obj(board))
        peers = [Peer(**p) for p in json.loads(data)["peers"]] if data else []
        return [p for p in peers if version is None or p.version == version]

    def register(self, board: str, peer: Peer) -> int:
        """Add (or replace, by ``peer_id``) ``peer``; returns its join position."""

        def add(peers: list[Peer]) -> list[Peer]:
            old = next((p for p in peers if p.peer_id == peer.peer_id), None)
            if old is not None:
                peer.position = old.position
                return [peer if p.peer_id == peer.peer_id else p for p in peers]
            peer.position = 1 + max((p.position for p in peers), default=-1)
            return [*peers, peer]

        self._change(board, add)
        return peer.position

    def join(self, board: str, peer: Peer, admit: Callable[[list[Peer]], list[Peer]]) -> list[Peer]:
        """Add ``peer`` after ``admit`` saw the board's peers (it returns those to keep,
        or raises to refuse), all in one compare-and-swap; the board as written."""
        written: list[Peer] = []

        def add(peers: list[Peer]) -> list[Peer]:
            kept = admit(peers)
            peer.position = 1 + max((p.position for p in kept), default=-1)
            written[:] = [*kept, peer]
            return list(written)

        self._change(board, add)
        return written

    def update(self, board: str, peer_id: str, **changes: Any) -> None:
        """Change fields of one peer (its state, mostly)."""

        def edit(peers: list[Peer]) -> list[Peer]:
            for p in peers:
                if p.peer_id == peer_id:
                    for name, value in changes.items():
                        setattr(p, name, value)
            return peers

        self._change(board, edit)

    def unregister(self, board: str, *peer_ids: str) -> None:
        """Remove peers (the board object goes when it is empty)."""
        self._change(board, lambda peers: [p for p in peers if p.peer_id not in peer_ids])

    def _change(self, board: str, change: Callable[[list[Peer]], list[Peer]]) -> None:
        obj = self._obj(board)
        for _ in range(MAX_SWAPS):
            data, token = read_versioned(self.store, obj)
            peers = [Peer(**p) for p in json.loads(data)["peers"]] if data else []
            new = change(peers)
            if not new and token == ABSENT:
                return
            blob = json.dumps({"peers": [asdict(p) for p in new]}).encode() if new else None
            try:
                swap(self.store, obj, blob, token)
                return
            except PreconditionFailed:
                continue
        raise PeerError(f"peer board {obj}: kept moving ({MAX_SWAPS} tries)")
