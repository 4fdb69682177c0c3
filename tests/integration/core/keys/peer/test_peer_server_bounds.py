"""The peer server cannot be held: a real server on loopback, hostile clients as real
sockets.

A connection that sends nothing, or an unfinished request head, is closed after the
server's (here short) timeout; connections beyond the per-address cap are answered
503 and closed by the accepting thread, with no thread of their own; and a peer from
another address still gets its bytes while they are held.  (Before: no timeout and
no cap, so 200 half-open sockets held 200 threads for as long as they liked.)

The client of a legitimate request binds ``127.0.0.2`` (Linux routes all of
127/8 to loopback), so it is another peer address than the hostile ``127.0.0.1``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.keys.peer import bounds, protocol
from airflow_provider_kinetic.core.keys.peer import bundle as peerbundle
from airflow_provider_kinetic.core.keys.peer import fetch as peerfetch
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.registry import peer_token
from tests.fixtures.waiting import wait_for

TOKEN = peer_token(b"deployment-secret", "bounds-test")
HOSTILE = 50
#: Long enough never to pass during a test that is not about it.
NEVER_S = 600.0
EOF_DEADLINE_S = 60.0


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"legitimate bytes" * 4096)
    return path


def _server(weights: Path, limits: bounds.Limits) -> peerserve.PeerServer:
    server = peerserve.PeerServer(TOKEN, limits=limits)
    size = weights.stat().st_size
    server.add(
        peerserve.Root(
            "abc123", "file", weights.name, [(weights.name, size)],
            ready={weights.name: (str(weights), "")},
        )
    )  # fmt: skip
    return server


@contextlib.contextmanager
def _sockets(address: str, count: int, first: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections from 127.0.0.1 that send ``first`` and then nothing."""
    host, port = address.rsplit(":", 1)
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.create_connection((host, int(port)), timeout=EOF_DEADLINE_S)
            held.append(s)
            if first:
                s.sendall(first)
        yield held
    finally:
        for s in held:
            s.close()


def _until_eof(s: socket.socket) -> bytes:
    """Everything the server sends before it closes (the socket's timeout is the
    generous deadline: a server that never closes fails the test)."""
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    return got


def _legit_get(address: str, path: str) -> tuple[int, bytes]:
    """A request with the scope's token, from another peer address."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(
        host, int(port), timeout=EOF_DEADLINE_S, source_address=("127.0.0.2", 0)
    )
    try:
        conn.request("GET", path, headers={protocol.TOKEN_HEADER: TOKEN})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_connections_over_the_per_address_cap_are_refused_without_threads(weights) -> None:
    cap = 8
    limits = bounds.Limits(header_s=NEVER_S, idle_s=NEVER_S, per_address=cap, total=32)
    threads_before = threading.active_count()
    server = _server(weights, limits)
    try:
        with _sockets(server.address, HOSTILE) as held:
            # The accepting thread saw all of them: ``cap`` served, the rest refused.
            wait_for(
                "every hostile connection admitted or refused",
                lambda: server.stats.open + server.stats.refused == HOSTILE,
                detail=lambda: server.stats,
            )
            assert (server.stats.open, server.stats.refused) == (cap, HOSTILE - cap)
            # Threads: the server's own, plus one per admitted connection, no more.
            assert threading.active_count() <= threads_before + 1 + cap
            # A legitimate peer from another address is served meanwhile.
            assert _legit_get(server.address, "/v/abc123/f/weights.bin") == (
                200,
                weights.read_bytes(),
            )
            # Every refused one got a quick 503 "busy" and the end of its connection.
            for s in held[cap:]:
                answer = _until_eof(s)
                assert answer.startswith(b"HTTP/1.1 503"), answer
                assert protocol.BUSY_HEADER.encode() in answer
            assert server.stats.peak == cap + 1  # the hostile ones and the legitimate one
    finally:
        server.close()
    # close() ended the admitted ones too: nothing left behind.
    assert server.stats.open == 0
    wait_for("the server's threads ended", lambda: threading.active_count() <= threads_before)


@pytest.mark.parametrize(
    "first",
    [b"", b"GET /v/abc123/manifest HTTP/1.1\r\nX-Kinetic-Peer-To"],
    ids=["sends-nothing", "unfinished-head"],
)
def test_a_connection_that_does_not_finish_its_request_is_closed(weights, first) -> None:
    # The idle timeout is never reached: only the request head's deadline can close
    # an unfinished head (a client dripping bytes would reset an idle timer forever).
    limits = bounds.Limits(header_s=0.2, idle_s=NEVER_S, per_address=HOSTILE, total=HOSTILE)
    threads_before = threading.active_count()
    server = _server(weights, limits)
    try:
        with _sockets(server.address, HOSTILE, first) as held:
            for s in held:
                assert _until_eof(s) == b""  # closed by the server, no answer
            wait_for("every connection's thread ended", lambda: server.stats.open == 0)
            assert server.stats.timed_out >= HOSTILE
            assert server.stats.refused == 0
        assert _legit_get(server.address, "/v/abc123/manifest")[0] == 200
    finally:
        server.close()
    wait_for("the server's threads ended", lambda: threading.active_count() <= threads_before)


def test_a_kept_alive_connection_left_idle_is_closed(weights) -> None:
    limits = bounds.Limits(header_s=0.2, idle_s=NEVER_S)
    server = _server(weights, limits)
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=EOF_DEADLINE_S) as s:
            s.sendall(
                b"GET /v/abc123/manifest HTTP/1.1\r\nHost: x\r\n"
                + protocol.TOKEN_HEADER.encode()
                + b": "
                + TOKEN.encode()
                + b"\r\n\r\n"
            )
            answer = _until_eof(s)  # the answer, then the close once the next head is late
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"name": "weights.bin"' in answer
        wait_for("the connection's thread ended", lambda: server.stats.open == 0)
    finally:
        server.close()


def test_a_getter_at_a_busy_peer_waits_its_turn_and_gets_everything(tmp_path: Path) -> None:
    """A cap of one connection per address against a getter's four parallel reads:
    the refused ones are told "busy" and ask again, none gives up on the peer."""
    src = tmp_path / "src"
    src.mkdir()
    sizes = [peerbundle.BUNDLE_FILE_MAX + 1] * 3 + [1000] * (2 * peerbundle.BUNDLE_FILES)
    listed = []
    for i, size in enumerate(sizes):
        (src / f"f{i:03d}.bin").write_bytes(os.urandom(size))
        listed.append([f"f{i:03d}.bin", size])
    limits = bounds.Limits(header_s=NEVER_S, idle_s=NEVER_S, per_address=1, total=1)
    server = peerserve.PeerServer(TOKEN, limits=limits)
    try:
        ready = {rel: (str(src / rel), "") for rel, _ in listed}
        server.add(peerserve.Root("v1", "dir", "", [(r, n) for r, n in listed], ready=ready))
        base = tmp_path / "copy"
        base.mkdir()
        got = peerfetch.pull_peer(
            server.address, "v1", TOKEN, str(base), listed, lambda *_: None, 60.0
        )
        assert server.stats.refused > 0  # the getter was turned away at least once
        assert server.stats.peak == 1
    finally:
        server.close()
    assert got == sum(sizes)
    for rel, _ in listed:
        assert (base / rel).read_bytes() == (src / rel).read_bytes()


def test_the_total_cap_holds_across_addresses(weights) -> None:
    limits = bounds.Limits(header_s=NEVER_S, idle_s=NEVER_S, per_address=4, total=6)
    threads_before = threading.active_count()
    server = _server(weights, limits)
    host, port = server.address.rsplit(":", 1)
    held: list[socket.socket] = []
    try:
        for source in ("127.0.0.1", "127.0.0.3"):  # 4 each: under per_address, over total
            for _ in range(4):
                held.append(
                    socket.create_connection(
                        (host, int(port)), timeout=EOF_DEADLINE_S, source_address=(source, 0)
                    )
                )
        wait_for(
            "all admitted or refused",
            lambda: server.stats.open + server.stats.refused == 8,
            detail=lambda: server.stats,
        )
        assert (server.stats.open, server.stats.refused) == (6, 2)
        assert threading.active_count() <= threads_before + 1 + 6
        for s in held[6:]:
            assert _until_eof(s).startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
        server.close()
    wait_for("the server's threads ended", lambda: threading.active_count() <= threads_before)
