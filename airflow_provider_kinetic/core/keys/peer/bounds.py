"""How much the peer server gives any one client: connection admission and the
timeouts on a connection, apart from what it serves (``serve.py``).

A connection must deliver a whole request head (its line and headers) within
``header_s`` of opening or of its previous response, and may sit ``idle_s`` at most
without a byte moving mid-request; then it is closed.  At most ``per_address``
connections from one peer address and ``total`` in all are served at once (one
thread each); a connection beyond them is answered 503 with ``X-Kinetic-Busy`` and
closed at once by the accepting thread, with no thread of its own (a getter backs
off and asks again).  Before these, 200 half-open connections held 200 threads for
as long as their client liked.

``BoundedServer`` admits connections and counts them (``ConnStats``);
``BoundedHandler`` times a connection's reads; the server's own handler adds the
requests on top.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from airflow_provider_kinetic.core.keys.peer.protocol import BUSY_HEADER, HOLD_S

log = logging.getLogger("kinetic.peers")

#: What a connection refused at the cap gets, written by the accepting thread.
BUSY_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\n" + BUSY_HEADER.encode() + b": 1\r\n"
    b"Retry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
)
IDLE_ENV = "KINETIC_PEER_IDLE_S"
HEADER_ENV = "KINETIC_PEER_HEADER_S"


@dataclass(frozen=True)
class Limits:
    """How much a peer server gives any one client (see the module docstring)."""

    #: Seconds a connection may take to send a whole request head.
    header_s: float = 30.0
    #: Seconds without a byte moving, mid-request (a body read, a response write).
    idle_s: float = 120.0
    #: Connections served at once from one peer address, and in all: a fanout of 50
    #: children, each reading on ``peer/fetch.py``'s 4 connections, is 200.
    per_address: int = 64
    total: int = 512

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, with the timeouts changed by ``KINETIC_PEER_*_S`` if set."""
        limits = cls()
        if os.environ.get(HEADER_ENV):
            limits = replace(limits, header_s=float(os.environ[HEADER_ENV]))
        if os.environ.get(IDLE_ENV):
            limits = replace(limits, idle_s=float(os.environ[IDLE_ENV]))
        return limits


@dataclass
class ConnStats:
    """What the connection gate saw (logs, tests)."""

    open: int = 0
    peak: int = 0
    refused: int = 0
    timed_out: int = 0


class BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``limits``' connections at once
    and answers the rest 503 busy from the accepting thread."""

    daemon_threads = True
    allow_reuse_address = True
    #: Connections waiting to be accepted: a parent's children open theirs at once
    #: (fanout x the getter's threads); the stdlib's 5 overflowed and reset some.
    request_queue_size = 256

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits,
    ) -> None:
        super().__init__(address, handler)
        self.limits = limits
        self.stats = ConnStats()
        self._gate = threading.Condition()
        self._per_address: dict[str, int] = {}
        self._open: set[Any] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection if under the caps; else a 503 and closed here."""
        peer, limits = client_address[0], self.limits
        with self._gate:
            mine = self._per_address.get(peer, 0)
            if mine >= limits.per_address or self.stats.open >= limits.total:
                self.stats.refused += 1
                admitted = False
            else:
                self._per_address[peer] = mine + 1
                self.stats.open += 1
                self.stats.peak = max(self.stats.peak, self.stats.open)
                self._open.add(request)
                admitted = True
        if not admitted:
            log.debug("peer %s refused: at the connection cap", peer)
            _refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._left(request, peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._left(request, client_address[0])

    def _left(self, request: Any, peer: str) -> None:
        with self._gate:
            if request not in self._open:
                return
            self._open.discard(request)
            self.stats.open -= 1
            left = self._per_address.get(peer, 1) - 1
            if left > 0:
                self._per_address[peer] = left
            else:
                self._per_address.pop(peer, None)
            self._gate.notify_all()

    def timed_out(self) -> None:
        """A connection's read waited too long (counted; the connection closes)."""
        with self._gate:
            self.stats.timed_out += 1

    def drop_all(self) -> None:
        """End every open connection (the server is closing)."""
        with self._gate:
            live = list(self._open)
        for request in live:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)
        with self._gate:  # their threads end (a held request within HOLD_S)
            self._gate.wait_for(lambda: self.stats.open == 0, HOLD_S + 5)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A getter that gave up and closed its connection is routine (it tries its
        next source); anything else is logged, never printed to the job's stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, TimeoutError)):
            log.debug("peer %s left: %s", client_address, exc)
        else:
            log.warning("peer request from %s failed", client_address, exc_info=True)


def _refuse(request: Any) -> None:
    """Tell a connection over the cap so, without blocking the accepting thread;
    what it already sent is read first, so the close is a FIN and not a reset that
    would lose the answer."""
    with contextlib.suppress(OSError):
        request.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while request.recv(1 << 16):
                pass
        request.send(BUSY_REPLY)


class _Reads(io.RawIOBase):
    """The handler's socket reads, each waiting at most ``idle_s``, and, while a
    request head is being read, no later than its deadline (a client that sends a
    byte now and then cannot hold the connection)."""

    def __init__(self, sock: Any, server: BoundedServer) -> None:
        self.sock, self.server = sock, server
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        wait = self.server.limits.idle_s
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
        try:
            if wait <= 0:
                raise TimeoutError("the request head did not arrive in time")
            self.sock.settimeout(wait)
            return self.sock.recv_into(buf)
        except TimeoutError:
            self.server.timed_out()
            raise


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler whose reads are timed: the head within ``header_s``, then
    ``idle_s`` at most per read or write (subclasses add the ``do_*`` methods)."""

    protocol_version = "HTTP/1.1"
    server: BoundedServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader, replaced (it holds the socket open)
        limits = self.server.limits
        self.connection.settimeout(limits.idle_s)  # writes: a client that stopped reading
        self._reads = _Reads(self.connection, self.server)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        """One request; its head must be whole within ``header_s`` (a timeout closes
        the connection: the stdlib's own handling)."""
        self._reads.deadline = time.monotonic() + self.server.limits.header_s
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._reads.deadline = None  # the head is in: the body and reply wait idle_s
        self.connection.settimeout(self.server.limits.idle_s)
        return ok
