"""Peers of a batch, as real processes on loopback, on both stores (a local root and
fake-gcs-server): ``locale="local"`` keys, tree broadcast, the per-batch token, a
parent that dies or stalls, peers that cannot be reached.

Each peer is ``tests/fixtures/peer_proc.py`` with a job's peer env: the code a remote
function runs (the runner's own part, the job env and the pod port, is covered by
``test_peers_jobs.py``).  A peer stays up until the test says its "job" ends, so the
tree is the same whatever the timing.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.data.value import content_hash_of
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError
from airflow_provider_kinetic.core.keys.peer import errors as peererrors
from airflow_provider_kinetic.core.keys.peer import fetch as peerfetch
from airflow_provider_kinetic.core.keys.peer import protocol
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.registry import (
    RECEIVING,
    Peer,
    PeerRegistry,
    board_name,
    peer_token,
)
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.keys import store as public_store
from tests.fixtures.stores import store  # noqa: F401 - the fixture, by name

ROOT = Path(__file__).resolve().parents[5]
SCOPE = "batch-peers-test"
TOKEN = peer_token(b"deployment-secret", SCOPE)


def make_tree(path: Path, files: int = 24, size: int = 40_000) -> Path:
    (path / "sub" / "deeper").mkdir(parents=True)
    (path / "empty").mkdir()
    for i in range(files):
        where = path / ("sub" if i % 2 else "sub/deeper")
        (where / f"part-{i:03d}.bin").write_bytes(os.urandom(size))
    (path / "README").write_text("weights\n")
    return path


class Peers:
    """The test's peer processes (all ended and reaped at teardown)."""

    def __init__(self, obj: ObjectStore) -> None:
        self.obj, self.procs = obj, []

    def start(self, job: str, *args: str, token: str = TOKEN, **env: str) -> subprocess.Popen:
        full = {
            **os.environ,
            "JOB_ID": job,
            "GCS_BUCKET": self.obj.bucket,
            "KINETIC_PEER_SCOPE": SCOPE,
            "KINETIC_PEER_TOKEN": token,
            "PYTHONPATH": str(ROOT),
            **env,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.peer_proc", *args],
            env=full,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def row(proc: subprocess.Popen) -> dict[str, Any]:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, proc.stderr.read()  # type: ignore[union-attr]
        return json.loads(line)

    @staticmethod
    def end(proc: subprocess.Popen) -> str:
        """End the peer's "job"; its log."""
        _, err = proc.communicate("\n", timeout=60)
        assert proc.returncode == 0, err
        return err

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


@pytest.fixture
def peers(store: ObjectStore) -> Iterator[Peers]:  # noqa: F811
    group = Peers(store)
    try:
        yield group
    finally:
        group.close()


def boards(obj: ObjectStore) -> list[str]:
    return obj.list(f"default/peers/{SCOPE}/")


def test_broadcast_tree_reads_the_store_once(store, peers, tmp_path) -> None:  # noqa: F811
    src = make_tree(tmp_path / "src")
    version = KeyStore(store).put("models/bcast", src)["version"]
    procs = [
        peers.start(f"child-{i}", "bcast", "models/bcast", str(tmp_path / f"dest-{i}"), "2", "20")
        for i in range(5)
    ]
    rows = [peers.row(p) for p in procs]
    assert all("error" not in r for r in rows), rows
    for i, r in enumerate(rows):
        assert r["version"] == version and r["dest"] == str(tmp_path / f"dest-{i}")
        assert content_hash_of(r["dest"], stat_cache=None) == version
        assert (Path(r["dest"]) / "empty").is_dir()
    size = rows[0]["size"]
    # One getter read the store, every other read a peer; with fanout 2, five getters
    # make a tree of depth 2: some read from a getter that itself read from a peer.
    from_store = [r for r in rows if r["broadcast"]["sources"] == ["store"]]
    assert len(from_store) == 1 and sum(r["broadcast"]["read"]["store"] for r in rows) == size
    addresses = {r["broadcast"]["sources"][0] for r in rows} - {"store"}
    assert len(addresses) >= 2, rows  # the root and at least one inner getter served
    logs = [peers.end(p) for p in procs]
    assert any("broadcast copy of key models/bcast ends with the job" in log for log in logs)
    assert boards(store) == []  # every registration removed at the jobs' end


def test_a_dead_or_stalled_parent_is_left_for_the_store(store, peers, tmp_path) -> None:  # noqa: F811
    src = make_tree(tmp_path / "src", files=6)
    version = KeyStore(store).put("models/stall", src)["version"]
    registry = PeerRegistry(store, SCOPE)
    board = board_name("bcast", f"models/stall@{version}")
    with socket.socket() as s:  # a port nothing listens on: a parent that died
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    registry.register(board, Peer("dead", dead, version, state=RECEIVING))
    # A live parent that never gets any file: it answers "not yet" forever (a stall).
    stuck = peerserve.PeerServer(TOKEN)
    try:
        # The version's true list (a list that is not the version's is a lie, refused
        # before any stall could show).
        files = sorted(
            (p.relative_to(src).as_posix(), p.stat().st_size) for p in src.rglob("*") if p.is_file()
        )
        stuck.add(peerserve.Root(version, "dir", "", files, state=RECEIVING))
        registry.register(board, Peer("stuck", stuck.address, version, state=RECEIVING))
        # Positions 0 (dead) and 1 (stuck); at fanout 1 getter 2 reads from 1, then 0.
        proc = peers.start("late", "bcast", "models/stall", str(tmp_path / "d"), "1", "1")
        row = peers.row(proc)
        log = peers.end(proc)
    finally:
        stuck.close()
    assert "error" not in row, (row, log)
    assert row["broadcast"]["sources"] == ["store"]
    assert content_hash_of(str(tmp_path / "d"), stat_cache=None) == version
    assert f"parent {stuck.address} stalled; re-parenting" in log
    assert f"parent {dead} is gone" in log


def test_a_wrong_token_gets_403_and_no_bytes(tmp_path) -> None:
    secret = tmp_path / "weights.bin"
    secret.write_bytes(b"private bytes" * 100)
    server = peerserve.PeerServer(TOKEN)
    try:
        server.add(
            peerserve.Root(
                "abc123", "file", "weights.bin", [("weights.bin", 1300)],
                ready={"weights.bin": (str(secret), "")},
            )
        )  # fmt: skip
        host, port = server.address.split(":")
        for path in ("/v/abc123/manifest", "/v/abc123/f/weights.bin"):
            for token in (peer_token(b"other-deployment", SCOPE), peer_token(b"x", "b2"), None):
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                headers = {} if token is None else {protocol.TOKEN_HEADER: token}
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (403, b""), path
                conn.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/v/abc123/f/weights.bin", headers={protocol.TOKEN_HEADER: TOKEN})
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, secret.read_bytes())
        conn.close()
    finally:
        server.close()


def test_local_key_served_by_its_job_and_ended_with_it(store, peers, tmp_path) -> None:  # noqa: F811
    src = make_tree(tmp_path / "src", files=4)
    publisher = peers.start("producer", "publish", "scratch/feats", str(src))
    put = peers.row(publisher)
    assert put["locale"] == "local" and put["uploaded"] == 0
    assert put["version"] == content_hash_of(str(src), stat_cache=None)
    assert store.list(cache_key(put["version"])) == []  # nothing uploaded
    assert KeyStore(store).ls() == []  # the key's pointer did not move either
    getter = peers.start("consumer", "get", "scratch/feats", str(tmp_path / "got"), "--no-wait")
    got = peers.row(getter)
    assert got["source"] == put["address"] and got["version"] == put["version"], got
    assert content_hash_of(str(tmp_path / "got"), stat_cache=None) == put["version"]
    outsider = peers.start(
        "outsider", "get", "scratch/feats", str(tmp_path / "no"), "--no-wait",
        token=peer_token(b"another-deployment", SCOPE),
    )  # fmt: skip
    refused = peers.row(outsider)
    assert "refused our token (403)" in refused["error"] and not (tmp_path / "no").exists()
    log = peers.end(publisher)
    assert "local key scratch/feats" in log and "ends with the job" in log
    assert boards(store) == []


def test_stale_local_key_is_skipped_and_the_store_copy_used(store, peers, tmp_path) -> None:  # noqa: F811
    src = make_tree(tmp_path / "src", files=3)
    publisher = peers.start("killed", "publish", "scratch/both", str(src))
    put = peers.row(publisher)
    os.kill(publisher.pid, signal.SIGKILL)  # its runner never unregisters
    publisher.wait(30)
    missing = peers.start("c1", "get", "scratch/both", str(tmp_path / "a"), "--no-wait")
    err = peers.row(missing)["error"]
    assert "locale='local'" in err and "store holds no copy" in err, err
    assert boards(store) == []  # the stale registration was removed by the getter
    # Published again locally and also put in the store: when the peer is gone, the
    # store's copy of that version is read.
    again = peers.start("killed-2", "publish", "scratch/both", str(src))
    assert peers.row(again)["version"] == put["version"]
    KeyStore(store).put("scratch/both", src)
    os.kill(again.pid, signal.SIGKILL)
    again.wait(30)
    fallback = peers.start("c2", "get", "scratch/both", str(tmp_path / "b"), "--no-wait")
    got = peers.row(fallback)
    assert got["version"] == put["version"] and "source" not in got, got
    assert content_hash_of(str(tmp_path / "b"), stat_cache=None) == put["version"]


def test_unreachable_peers_fall_back_with_one_warning(store, peers, tmp_path) -> None:  # noqa: F811
    src = make_tree(tmp_path / "src", files=3)
    version = KeyStore(store).put("scratch/policy", src)["version"]
    registry = PeerRegistry(store, SCOPE)
    for i, address in enumerate(("10.255.255.1:8471", "10.255.255.2:8471")):
        registry.register(board_name("local", "scratch/policy"), Peer(f"p{i}", address, version))
    proc = peers.start(
        "blocked", "get", "scratch/policy", str(tmp_path / "d"), KINETIC_PEER_CONNECT_S="0.3"
    )
    row = peers.row(proc)
    log = peers.end(proc)
    assert "error" not in row and row["version"] == version, (row, log)
    assert log.count("cannot be reached") == 1, log


def test_locale_local_outside_a_job_is_refused(tmp_path, monkeypatch) -> None:
    for name in ("JOB_ID", "KINETIC_PEER_SCOPE", "KINETIC_PEER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    src = make_tree(tmp_path / "src", files=1)
    with pytest.raises(KeyNameError, match="locale='local'.*only inside a kinetic job"):
        public_store.put("scratch/x", src, locale="local", conn_id="no_such_connection")
    with pytest.raises(KeyNameError, match="locale='nearby'"):
        public_store.put("scratch/x", src, locale="nearby")
    window = BroadcastWindow(fanout=2)
    with pytest.raises(KeyNameError, match="broadcast=.*only inside a kinetic job"):
        public_store.get("scratch/x", tmp_path / "d", broadcast=window, conn_id="no_such")
    assert not (tmp_path / "d").exists()


def test_a_peers_list_cannot_write_outside_the_copy(tmp_path) -> None:
    (tmp_path / "evil").write_bytes(b"12345")
    server = peerserve.PeerServer(TOKEN)
    base = tmp_path / "copy" / "inside"
    base.mkdir(parents=True)
    try:
        for rel in ("../evil", "/etc/evil", "a/../../evil", "./x"):
            server.add(peerserve.Root("abc123", "dir", "", [(rel, 5)],
                                      ready={rel: (str(tmp_path / "evil"), "")}))  # fmt: skip
            with pytest.raises(peererrors.PeerUnavailable, match="not relative: refused"):
                peerfetch.pull_peer(
                    server.address, "abc123", TOKEN, str(base), [[rel, 5]],
                    lambda *_: None, 5.0,
                )  # fmt: skip
    finally:
        server.close()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["copy", "evil", "inside"]


def test_a_child_whose_parent_died_re_parents_to_the_grandparent(store, peers, tmp_path) -> None:  # noqa: F811
    src = make_tree(tmp_path / "src", files=4)
    version = KeyStore(store).put("models/reparent", src)["version"]
    registry = PeerRegistry(store, SCOPE)
    board = board_name("bcast", f"models/reparent@{version}")
    files = sorted(
        (p.relative_to(src).as_posix(), p.stat().st_size) for p in src.rglob("*") if p.is_file()
    )
    # Position 0: a complete copy, served by a live peer; position 1: died.
    root = peerserve.PeerServer(TOKEN)
    try:
        ready = {rel: (str(src / rel), "") for rel, _ in files}
        root.add(peerserve.Root(version, "dir", "", files, ["empty"], ready=ready))
        registry.register(board, Peer("root", root.address, version))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        registry.register(board, Peer("dead", dead, version, state=RECEIVING))
        proc = peers.start("child", "bcast", "models/reparent", str(tmp_path / "d"), "1", "30")
        row = peers.row(proc)
        log = peers.end(proc)
    finally:
        root.close()
    assert row["broadcast"]["sources"] == [root.address], (row, log)
    assert row["broadcast"]["read"]["store"] == 0
    assert content_hash_of(str(tmp_path / "d"), stat_cache=None) == version
    assert f"parent {dead} is gone" in log
