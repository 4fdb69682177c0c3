"""The tensor broadcast's rendezvous on the peer registry, through a local store root
(no torch needed): ranks by compare-and-swap on the scope's board, a full quorum
refused, an abandoned rendezvous restarted, rank 0's address of another session
ignored, the wait bounded by the timeout, and every rank's verdict (reached rank 0
or not) deciding between a group and each rank reading the store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic import BroadcastWindow
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer.registry import (
    COMPLETE,
    FAILED,
    PEERS_PREFIX,
    Peer,
    PeerRegistry,
    board_name,
)
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindowError
from airflow_provider_kinetic.core.keys.tensors import broadcast as tensor_broadcast
from airflow_provider_kinetic.core.keys.tensors.rendezvous import Rendezvous, RendezvousError
from airflow_provider_kinetic.core.storage import LocalStore

BOARD = board_name("tensor", "models/x")


def peers(store: LocalStore, n: int, timeout_s: float = 30.0) -> list[Rendezvous]:
    return [Rendezvous(store, "grp-1", "models/x", n, timeout_s) for _ in range(n)]


def test_concurrent_joins_get_distinct_ranks_and_a_full_quorum_is_refused(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    group = peers(store, 6)
    ranks: list[int] = []
    threads = [threading.Thread(target=lambda r=r: ranks.append(r.join())) for r in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(ranks) == list(range(6))
    assert {r.session for r in group} == {group[0].session}  # one session for all
    # The members are the registry's records: position = rank, on the scope's board.
    board = PeerRegistry(store, "grp-1").lookup(BOARD)
    assert {p.peer_id: p.position for p in board} == {r.me.peer_id: r.rank for r in group}
    assert all(p.extra == {"group": "models/x", "world_size": 6} for p in board)
    with pytest.raises(RendezvousError, match=r"'models/x' in grp-1: the quorum of world_size=6"):
        peers(store, 6)[0].join()


def test_rank_0_address_is_read_only_from_its_own_session(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    zero, one = peers(store, 2, timeout_s=0.5)
    assert (zero.join(), one.join()) == (0, 1)
    # A record of another session (an abandoned rendezvous) is not used.
    one.session = "old"
    with pytest.raises(RendezvousError, match=r"rank 0 published no address within 0.5s"):
        one.wait_address()
    one.session = zero.session
    zero.publish("127.0.0.1", 29500)
    assert one.wait_address() == ("127.0.0.1", 29500)
    zero.remove()
    assert store.list(f"{PEERS_PREFIX}/grp-1/") == []


def test_an_abandoned_rendezvous_is_started_afresh(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    old = peers(store, 2, timeout_s=0.2)
    assert [r.join() for r in old] == [0, 1]  # full, and never removed (crashed)
    registry = PeerRegistry(store, "grp-1")
    registry.update(BOARD, old[0].me.peer_id, joined=old[0].me.joined - 10)  # past the timeout
    new = Rendezvous(store, "grp-1", "models/x", 2, 0.2)
    assert new.join() == 0 and new.session != old[0].session
    assert [p.peer_id for p in registry.lookup(BOARD)] == [new.me.peer_id]


def test_every_rank_waits_for_all_verdicts_and_one_failure_fails_the_group(
    tmp_path: Path,
) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    zero, one, two = peers(store, 3, timeout_s=0.5)
    for r in (zero, one, two):
        r.join()
    zero.publish("127.0.0.1", 29500)
    one.mark(COMPLETE)
    # Rank 2 has not said: nobody may go on (the group, or the store) yet.
    with pytest.raises(RendezvousError, match=r"only 2 of 3 peers reached rank 0 within 0.5s"):
        one.wait_all()
    two.mark(COMPLETE)
    assert zero.wait_all() is True and one.wait_all() is True
    # The same with rank 2 unable to reach rank 0: every rank reads the store.
    two.mark(FAILED)
    assert zero.wait_all() is False and one.wait_all() is False and two.wait_all() is False
    zero.remove()
    # Once rank 0 removed the session, a rank still waiting goes to the store too.
    assert one.wait_all() is False
    assert store.list(f"{PEERS_PREFIX}/grp-1/") == []


def test_removal_keeps_other_boards_of_the_scope(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    registry = PeerRegistry(store, "grp-1")
    registry.register(board_name("bcast", "models/x"), Peer("file-peer", "127.0.0.1:1", "ab"))
    zero, one = peers(store, 2)
    zero.join(), one.join()
    zero.remove()
    assert registry.lookup(BOARD) == []
    assert [p.peer_id for p in registry.lookup(board_name("bcast", "models/x"))] == ["file-peer"]


def test_broadcast_needs_a_world_size_and_a_job(tmp_path: Path) -> None:
    keys = KeyStore(LocalStore(str(tmp_path / "bucket")))
    with pytest.raises(BroadcastWindowError, match="needs BroadcastWindow\\(world_size=N\\)"):
        tensor_broadcast.get(keys, "m/x", {}, None, BroadcastWindow(), "grp-1")
    with pytest.raises(RendezvousError, match="call it inside a kinetic job"):
        tensor_broadcast.get(keys, "m/x", {}, None, BroadcastWindow(world_size=2), None)
    assert keys.store.list("") == []
