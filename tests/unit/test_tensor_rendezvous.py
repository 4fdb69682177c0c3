"""The tensor broadcast's rendezvous through a local store root (no torch needed):
ranks by compare-and-swap, a full quorum refused, an abandoned rendezvous restarted,
rank 0's address of another session ignored, the wait bounded by the timeout."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic import BroadcastWindow
from airflow_provider_kinetic.core.keys import tensor_broadcast
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.tensor_rendezvous import Rendezvous, RendezvousError
from airflow_provider_kinetic.core.keys.window import BroadcastWindowError
from airflow_provider_kinetic.core.storage import LocalStore


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
    with pytest.raises(RendezvousError, match=r"'models/x' in grp-1: the quorum of world_size=6"):
        peers(store, 6)[0].join()


def test_rank_0_address_is_read_only_from_its_own_session(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    zero, one = peers(store, 2, timeout_s=0.5)
    assert (zero.join(), one.join()) == (0, 1)
    # An address left by an abandoned rendezvous (another session) is not used.
    stale = {"host": "10.0.0.9", "port": 1, "session": "old"}
    store.write_bytes(one.address_key, json.dumps(stale).encode())
    with pytest.raises(RendezvousError, match=r"rank 0 published no address within 0.5s"):
        one.wait_address()
    zero.publish("127.0.0.1", 29500)
    assert one.wait_address() == ("127.0.0.1", 29500)
    zero.remove()
    assert store.list("_groups/grp-1/") == []


def test_an_abandoned_rendezvous_is_started_afresh(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    old = peers(store, 2, timeout_s=0.2)
    assert [r.join() for r in old] == [0, 1]  # full, and never removed (crashed)
    body = json.loads(store.read_bytes(old[0].members_key))
    body["opened"] -= 10  # older than the timeout
    store.write_bytes(old[0].members_key, json.dumps(body).encode())
    new = Rendezvous(store, "grp-1", "models/x", 2, 0.2)
    assert new.join() == 0 and new.session != old[0].session


def test_broadcast_needs_a_world_size_and_a_job(tmp_path: Path) -> None:
    keys = KeyStore(LocalStore(str(tmp_path / "bucket")))
    with pytest.raises(BroadcastWindowError, match="needs BroadcastWindow\\(world_size=N\\)"):
        tensor_broadcast.get(keys, "m/x", {}, None, BroadcastWindow(), "grp-1")
    with pytest.raises(RendezvousError, match="call it inside a kinetic job"):
        tensor_broadcast.get(keys, "m/x", {}, None, BroadcastWindow(world_size=2), None)
    assert keys.store.list("") == []
