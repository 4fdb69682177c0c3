"""Rendezvous for a tensor broadcast, through the store: who is rank 0 and where it
listens.

Why the store: every peer of a batch (or every host of an LWS job) already holds the
job's store and nothing else in common; no extra service has to run, and the store's
compare-and-swap (``storage/swap.py``) makes rank assignment race-free on both GCS
(generation match) and a local root (flock).

The protocol, under ``_groups/{scope}/rendezvous/{digest of the group}/``:

1. each peer appends a fresh member id to ``members.json`` by compare-and-swap; its
   position is its rank (a quorum already full is refused, naming the group; a file
   older than the window's timeout is an abandoned rendezvous and is started afresh,
   with a new session id);
2. rank 0 opens a ``torch.distributed`` TCPStore on a free port and writes its
   address:port and the session id to ``address.json`` (an address of another
   session is ignored);
3. the others poll ``address.json`` (bounded by the window's timeout) and connect;
4. once every rank has taken part in a collective, every peer has read the address,
   so rank 0 removes both objects (also when it fails).

``scope`` is the batch id (``KINETIC_GROUP_ID``), else the job id (an LWS job's hosts
share it), so two batches broadcasting the same key never meet.

This should later sit on the peer registry (``core/keys/peers.py``, where each job's
runner registers the address it serves on): the member list and rank 0's address are
the same kind of record, and one registry would let the file broadcast and the
tensor broadcast share discovery, the per-batch token and the network-policy fallback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectStore, PreconditionFailed
from airflow_provider_kinetic.core.storage.swap import read_versioned, swap

#: The address rank 0 advertises, when set (else: loopback for a local store root,
#: the host's resolved address otherwise).
ADDRESS_ENV = "KINETIC_PEER_ADDRESS"
MAX_SWAPS = 200


class RendezvousError(KineticError, RuntimeError):
    """The quorum did not form (full, or not complete within the timeout)."""


def advertise_address(store: ObjectStore) -> str:
    """Where the other peers can reach this process.  A local store root means every
    peer runs on this machine (the local backend), so loopback; on a cluster, the
    pod's own address."""
    if os.environ.get(ADDRESS_ENV):
        return os.environ[ADDRESS_ENV]
    if store.scheme == "file":
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def prefix(scope: str, group: str) -> str:
    digest = hashlib.sha256(group.encode()).hexdigest()[:16]
    return f"_groups/{scope}/rendezvous/{digest}"


@dataclass
class Rendezvous:
    """One peer's side of the rendezvous of ``group`` within ``scope``."""

    store: ObjectStore
    scope: str
    group: str
    world_size: int
    timeout_s: float

    def __post_init__(self) -> None:
        self.prefix = prefix(self.scope, self.group)
        self.member = secrets.token_hex(8)
        self.deadline = time.monotonic() + self.timeout_s
        self.session = ""

    @property
    def members_key(self) -> str:
        return f"{self.prefix}/members.json"

    @property
    def address_key(self) -> str:
        return f"{self.prefix}/address.json"

    def join(self) -> int:
        """Append this peer to the member list by compare-and-swap; its rank."""
        for _ in range(MAX_SWAPS):
            data, token = read_versioned(self.store, self.members_key)
            body = json.loads(data) if data else None
            if body is None or time.time() - body["opened"] > self.timeout_s:
                body = {"group": self.group, "world_size": self.world_size, "members": []}
                body.update(opened=time.time(), session=secrets.token_hex(8))
            members: list[str] = body["members"]
            if len(members) >= self.world_size:
                raise RendezvousError(
                    f"tensor broadcast {self.group!r} in {self.scope}: the quorum of "
                    f"world_size={self.world_size} is already full (more peers than "
                    "world_size? give each broadcast its own group_id)"
                )
            members.append(self.member)
            try:
                swap(self.store, self.members_key, json.dumps(body).encode(), token)
            except PreconditionFailed:
                continue
            self.session = str(body["session"])
            return len(members) - 1
        raise RendezvousError(f"tensor broadcast {self.group!r}: the member list kept moving")

    def publish(self, host: str, port: int) -> None:
        """Rank 0: where the others connect."""
        body = {"host": host, "port": port, "session": self.session}
        self.store.write_bytes(self.address_key, json.dumps(body).encode())

    def wait_address(self) -> tuple[str, int]:
        """The others: rank 0's address, polled until the window's timeout."""
        pause = 0.02
        while True:
            data, _ = read_versioned(self.store, self.address_key)
            body: dict[str, Any] = json.loads(data) if data else {}
            if body.get("session") == self.session:  # not an abandoned rendezvous's
                return str(body["host"]), int(body["port"])
            if time.monotonic() > self.deadline:
                raise RendezvousError(
                    f"tensor broadcast {self.group!r} in {self.scope}: rank 0 published no "
                    f"address within {self.timeout_s:g}s (the window's timeout)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def remaining_s(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def remove(self) -> None:
        """Rank 0, once the group formed (or failed): delete the rendezvous objects."""
        for key in (self.address_key, self.members_key):
            with contextlib.suppress(Exception):  # best effort: a later join restarts it
                self.store.delete(key)
