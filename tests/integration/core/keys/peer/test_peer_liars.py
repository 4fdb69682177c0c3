"""A lying parent does not break its children: they end with the right bytes from the
store, the log names the peer and what was wrong, and no more bytes are read from
the liar than the version lists.

Real parts: the children are ``tests/fixtures/peer_proc.py`` processes (a job's
``store.get(..., broadcast=...)``), the store a local file store, and each liar a
real server on loopback registered on the broadcast's board ahead of them:

- a real peer server serving other bytes under the version's names and sizes (its
  digests are those of what it sends, so only the tree check can tell);
- a real peer server listing ten times the version's bytes;
- a raw HTTP server that answers a file with a body ten times its listed size.

Before: the wrong bytes failed the child with ``KeyVerifyError`` ("read from the
store"), the inflated list was read whole, and an over-long body was read to its
end before the child gave up on the parent.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.data.value import content_hash_of
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer import protocol
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.registry import Peer, PeerRegistry, board_name
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore
from tests.integration.core.keys.peer.test_peers import SCOPE, TOKEN, Peers, make_tree

BIG = 6 << 20  # over peer/bundle.py's BUNDLE_FILE_MAX: a file of its own request


@pytest.fixture
def local(tmp_path: Path) -> ObjectStore:
    return LocalStore(str(tmp_path / "bucket"))


@pytest.fixture
def children(local: ObjectStore) -> Iterator[Peers]:
    group = Peers(local)
    try:
        yield group
    finally:
        group.close()


def _listing(src: Path) -> list[tuple[str, int]]:
    return sorted(
        (p.relative_to(src).as_posix(), p.stat().st_size) for p in src.rglob("*") if p.is_file()
    )


def _at_position_0(store: ObjectStore, key: str, version: str, address: str) -> None:
    """The liar joins the broadcast first: the next getters read from it."""
    PeerRegistry(store, SCOPE).register(
        board_name("bcast", f"{key}@{version}"), Peer("liar", address, version)
    )


def test_a_parent_serving_other_bytes_is_left_for_the_store(local, children, tmp_path) -> None:
    src = make_tree(tmp_path / "src", files=6, size=30_000)
    version = KeyStore(local).put("models/liar", src)["version"]
    files = _listing(src)
    size = sum(n for _, n in files)
    # Same names, same sizes, other bytes.
    fake = tmp_path / "fake"
    for rel, n in files:
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_bytes(os.urandom(n))
    liar = peerserve.PeerServer(TOKEN)
    try:
        ready = {rel: (str(fake / rel), "") for rel, _ in files}
        liar.add(peerserve.Root(version, "dir", "", files, ["empty"], ready=ready))
        _at_position_0(local, "models/liar", version, liar.address)
        # Fanout 1: child 1 reads the liar, child 2 reads child 1 (then the liar).
        procs = [
            children.start(f"c{i}", "bcast", "models/liar", str(tmp_path / f"d{i}"), "1", "30")
            for i in (1, 2)
        ]
        rows = [children.row(p) for p in procs]
        logs = [children.end(p) for p in procs]
    finally:
        liar.close()
    for i, row in enumerate(rows, 1):
        assert "error" not in row, (row, logs)
        assert content_hash_of(str(tmp_path / f"d{i}"), stat_cache=None) == version
        assert liar.address not in row["broadcast"]["sources"]
        assert row["broadcast"]["read_from"].get(liar.address, 0) <= size
    # The child at position 1 (whichever joined first) read the liar whole, found the
    # copy false, and read the store instead; the other read from it or the store.
    (first, log), *_ = [
        (r, g)
        for r, g in zip(rows, logs, strict=True)
        if liar.address in r["broadcast"]["read_from"]
    ]
    assert first["broadcast"]["sources"] == ["store"]
    assert first["broadcast"]["read_from"][liar.address] == size
    assert f"parent {liar.address} sent what cannot be the content" in log
    assert "hashes to" in log and "reading the store" in log


def test_a_parent_listing_more_bytes_than_the_version_is_not_read(
    local, children, tmp_path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(100_000))
    version = KeyStore(local).put("models/inflated", src / "weights.bin")["version"]
    inflated = tmp_path / "inflated.bin"
    inflated.write_bytes(os.urandom(1_000_000))  # ten times the version's bytes
    liar = peerserve.PeerServer(TOKEN)
    try:
        liar.add(
            peerserve.Root(
                version, "file", "weights.bin", [("weights.bin", 1_000_000)],
                ready={"weights.bin": (str(inflated), "")},
            )
        )  # fmt: skip
        _at_position_0(local, "models/inflated", version, liar.address)
        proc = children.start("c", "bcast", "models/inflated", str(tmp_path / "d"), "1", "30")
        row = children.row(proc)
        log = children.end(proc)
    finally:
        liar.close()
    assert "error" not in row, (row, log)
    assert (tmp_path / "d").read_bytes() == (src / "weights.bin").read_bytes()
    assert row["broadcast"]["sources"] == ["store"]
    assert row["broadcast"]["read_from"].get(liar.address, 0) == 0  # refused at its list
    assert f"parent {liar.address} sent what cannot be the content" in log
    assert "listed 1 file(s) of 1000000 bytes; the version has 1 of 100000" in log


class _OverLong(BaseHTTPRequestHandler):
    """Lists the version truly, then answers its file with the true bytes followed by
    nine times as many more, under a Content-Length of all of them."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        box = self.server.box
        if self.path.endswith("/manifest"):
            body = json.dumps(box["manifest"]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        data: bytes = box["data"]
        claimed = 10 * len(data)
        self.send_response(200)
        self.send_header("Content-Length", str(claimed))
        self.send_header(protocol.DIGEST_HEADER, box["digest"])
        self.end_headers()
        self.close_connection = True
        chunks = [data] + [b"\0" * len(data)] * 9
        try:
            for chunk in chunks:
                for at in range(0, len(chunk), 1 << 16):
                    self.wfile.write(chunk[at : at + (1 << 16)])
                    with box["lock"]:
                        box["sent"] += len(chunk[at : at + (1 << 16)])
        except OSError:
            return  # the child closed: what it did not read was never sent


def test_a_parent_sending_a_body_longer_than_the_file_is_not_read(
    local, children, tmp_path
) -> None:
    src = tmp_path / "weights.bin"
    src.write_bytes(os.urandom(BIG))
    version = KeyStore(local).put("models/overlong", src)["version"]
    box: dict[str, Any] = {
        "manifest": {
            "version": version, "kind": "file", "name": "weights.bin",
            "files": [["weights.bin", BIG]], "empty_dirs": [], "state": "complete",
        },
        "data": src.read_bytes(),
        "digest": protocol.file_digest("weights.bin", str(src)),
        "sent": 0,
        "lock": threading.Lock(),
    }  # fmt: skip
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _OverLong)
    httpd.box = box  # type: ignore[attr-defined]
    serving = threading.Thread(target=httpd.serve_forever, daemon=True)
    serving.start()
    address = f"127.0.0.1:{httpd.server_address[1]}"
    try:
        _at_position_0(local, "models/overlong", version, address)
        proc = children.start("c", "bcast", "models/overlong", str(tmp_path / "d"), "1", "30")
        row = children.row(proc)
        log = children.end(proc)
    finally:
        httpd.shutdown()
        httpd.server_close()  # joins its handler threads
        serving.join(30)
    assert "error" not in row, (row, log)
    assert (tmp_path / "d").read_bytes() == src.read_bytes()
    assert row["broadcast"]["sources"] == ["store"]
    # Refused at its Content-Length, before a byte of the body was read; the liar
    # could not push its ten times out (only what the sockets' buffers took).
    assert box["sent"] < 10 * BIG
    assert row["broadcast"]["read_from"].get(address, 0) == 0
    assert f"parent {address} sent what cannot be the content" in log
    assert f"byte body where the list has {BIG} bytes" in log


def test_a_data_broadcast_checks_a_parents_list_against_the_stores(
    local, children, tmp_path
) -> None:
    """A shared Data has no record of its files but the store's listing: a parent
    that moves bytes from one file to another (the same count and total) is refused
    at its list, and the child reads the store."""
    src = make_tree(tmp_path / "src", files=4, size=20_000)
    digest = KeyStore(local).put("data/liar", src)["version"]  # the same data-cache entry
    files = _listing(src)
    shifted = [
        (rel, n + (500 if i == 0 else -500 if i == 1 else 0)) for i, (rel, n) in enumerate(files)
    ]
    fake = tmp_path / "fake"
    for rel, n in shifted:
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_bytes(os.urandom(n))
    liar = peerserve.PeerServer(TOKEN)
    try:
        ready = {rel: (str(fake / rel), "") for rel, _ in shifted}
        liar.add(peerserve.Root(digest, "dir", "", shifted, ready=ready))
        PeerRegistry(local, SCOPE).register(
            board_name("bcast", f"data@{digest}"), Peer("liar", liar.address, digest)
        )
        proc = children.start("c", "data", digest, str(tmp_path / "d"), "1", "30")
        row = children.row(proc)
        log = children.end(proc)
    finally:
        liar.close()
    assert "error" not in row, (row, log)
    assert content_hash_of(row["dest"], stat_cache=None) == digest
    assert row["broadcast"]["sources"] == ["store"]
    assert row["broadcast"]["read_from"].get(liar.address, 0) == 0
    assert f"parent {liar.address} sent what cannot be the content" in log
    assert "listed files or sizes other than the version's" in log
