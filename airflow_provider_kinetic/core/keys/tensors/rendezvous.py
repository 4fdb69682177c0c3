"""Rendezvous for a tensor broadcast, on the peer registry: who is rank 0, where it
listens, and whether every rank can reach it.

Why the registry (``peers.py``): the file broadcast and ``locale="local"`` keys
already find each other there, per scope, with compare-and-swap on both stores (GCS
generation match, a local root's flock).  The tensor broadcast's members and rank
0's address are the same kind of record, so the three share one discovery, one scope
(``KINETIC_PEER_SCOPE``: the batch, or the job whose LWS hosts meet) and one answer
to a network policy that blocks pod-to-pod traffic.

The protocol, on the scope's board ``tensor/{group}``:

1. each peer joins by compare-and-swap; its position is its rank.  A quorum already
   full is refused, naming the group.  A board whose first peer joined longer ago
   than the window's timeout is an abandoned rendezvous: it is started afresh.  The
   first peer's id is the session: a record of another session is never used;
2. rank 0 opens a ``torch.distributed`` TCPStore on a free port and writes its
   address on its own record (state ``complete``);
3. the others poll the board for it (bounded by the timeout) and connect, within
   the peers' connect time (``KINETIC_PEER_CONNECT_S``); each then marks itself
   ``complete``, or ``failed`` when rank 0 cannot be reached;
4. every rank waits until all N are ``complete`` (the group forms) or one has
   ``failed``: then no group is made and every rank reads the store itself, with
   the peers' one warning (``locale.unreachable_once``).  Rank 0 waits for all N
   verdicts in that case, so nobody is left connecting to a closed store;
5. rank 0 removes the session's records once every rank has passed step 4 (after
   the first collective, or at once on the fallback), and also when it fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.keys.joblocal import JOB_ENV, unreachable_once
from airflow_provider_kinetic.core.keys.peer.conn import connect_s
from airflow_provider_kinetic.core.keys.peer.registry import (
    COMPLETE,
    FAILED,
    RECEIVING,
    Peer,
    PeerRegistry,
    board_name,
)
from airflow_provider_kinetic.core.spec.peerport import POD_IP_ENV
from airflow_provider_kinetic.core.storage import ObjectStore

#: The address rank 0 advertises, when set (else: the pod's IP on GKE, loopback for
#: a local store root, the host's resolved address otherwise).
ADDRESS_ENV = "KINETIC_PEER_ADDRESS"


class RendezvousError(KineticError, RuntimeError):
    """The quorum did not form (full, or not complete within the timeout)."""


def advertise_address(store: ObjectStore) -> str:
    """Where the other peers can reach this process: the address the peer server
    would give (the pod's IP), else loopback when every peer shares a local store
    root (the local backend), else the host's resolved address."""
    for name in (ADDRESS_ENV, POD_IP_ENV):
        if os.environ.get(name):
            return os.environ[name]
    if store.scheme == "file":
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


@dataclass
class Rendezvous:
    """One peer's side of the rendezvous of ``group`` within ``scope``."""

    store: ObjectStore
    scope: str
    group: str
    world_size: int
    timeout_s: float

    def __post_init__(self) -> None:
        self.registry = PeerRegistry(self.store, self.scope)
        self.board = board_name("tensor", self.group)
        job = os.environ.get(JOB_ENV, "job")
        self.me = Peer(f"{job}-{os.getpid()}-{secrets.token_hex(4)}", "", "", job, RECEIVING)
        self.me.extra = {"group": self.group, "world_size": self.world_size}
        self.deadline = time.monotonic() + self.timeout_s
        self.session = ""
        self.rank = -1

    def _what(self) -> str:
        return f"tensor broadcast {self.group!r} in {self.scope}"

    def join(self) -> int:
        """Join the board by compare-and-swap; this peer's rank."""

        def admit(peers: list[Peer]) -> list[Peer]:
            if peers and time.time() - peers[0].joined > self.timeout_s:
                return []  # abandoned (its peers gave up): start afresh
            if len(peers) >= self.world_size:
                raise RendezvousError(
                    f"{self._what()}: the quorum of world_size={self.world_size} is "
                    "already full (more peers than world_size? give each broadcast its "
                    "own group_id)"
                )
            return peers

        self.me.joined = time.time()
        written = self.registry.join(self.board, self.me, admit)
        self.session, self.rank = written[0].peer_id, len(written) - 1
        return self.rank

    def _session(self) -> list[Peer]:
        """This session's records in rank order ([] once the session is gone)."""
        peers = self.registry.lookup(self.board)
        if not peers or peers[0].peer_id != self.session:
            return []
        return peers

    def publish(self, host: str, port: int) -> None:
        """Rank 0: where the others connect."""
        self.registry.update(self.board, self.me.peer_id, address=f"{host}:{port}", state=COMPLETE)

    def mark(self, state: str) -> None:
        """This rank reached rank 0 (``complete``) or could not (``failed``)."""
        self.registry.update(self.board, self.me.peer_id, state=state)

    def _poll(self, ready: Callable[[list[Peer]], Any], why: Callable[[list[Peer]], str]) -> Any:
        """``ready``'s first answer that is not None, polling the board until the
        window's timeout; then the error says ``why`` (of the last board seen)."""
        pause = 0.02
        while True:
            peers = self._session()
            found = ready(peers)
            if found is not None:
                return found
            if time.monotonic() > self.deadline:
                raise RendezvousError(
                    f"{self._what()}: {why(peers)} within {self.timeout_s:g}s "
                    "(the window's timeout)"
                )
            time.sleep(pause)  # a bounded poll of the board, backing off
            pause = min(pause * 2, 0.5)

    def wait_address(self) -> tuple[str, int]:
        """The others: rank 0's address, polled until the window's timeout."""

        def ready(peers: list[Peer]) -> tuple[str, int] | None:
            if peers and peers[0].address:
                host, _, port = peers[0].address.rpartition(":")
                return host, int(port)
            return None

        return self._poll(ready, lambda _: "rank 0 published no address")

    def wait_all(self) -> bool:
        """True once every rank reached rank 0; False as soon as one could not (rank
        0: once every rank has said which)."""

        def ready(peers: list[Peer]) -> bool | None:
            states = [p.state for p in peers]
            if self.rank != 0 and FAILED in states:
                return False
            if len(peers) < self.world_size or RECEIVING in states:
                return None if peers or self.rank == 0 else False  # gone: rank 0 gave up
            return FAILED not in states

        def why(peers: list[Peer]) -> str:
            done = sum(p.state != RECEIVING for p in peers)
            return f"only {done} of {self.world_size} peers reached rank 0"

        return bool(self._poll(ready, why))

    def remaining_s(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def connect_timeout(self) -> timedelta:
        """How long a rank tries rank 0's TCPStore before it calls it unreachable."""
        return timedelta(seconds=min(connect_s(), self.remaining_s()))

    def unreachable(self, address: str, exc: BaseException) -> None:
        """The peers' one warning, and this rank's ``failed`` verdict."""
        unreachable_once(address, exc)
        self.mark(FAILED)

    def remove(self) -> None:
        """Rank 0, once the group formed (or failed): delete the session's records."""
        with contextlib.suppress(Exception):  # best effort: a later join restarts it
            ids = [p.peer_id for p in self._session()] or [self.me.peer_id]
            self.registry.unregister(self.board, *ids)
