"""The runner's peer server: serves a job's local keys and broadcast copies to the
peers of its scope, over plain HTTP on one port.

Why a server in the runner (not a sidecar): the files live in the runner's file
system and die with it, which is exactly the lifetime a ``locale="local"`` key has.
It starts on first use (a thread; stdlib ``http.server``), so a job that never
publishes opens no port.  On GKE the port is declared on the pod
(``KINETIC_PEER_PORT``, ``manifests.py``) and the address is the pod's IP
(``KINETIC_POD_IP``, from the downward API); elsewhere (the local backend, the GKE
double's kubelet) it is loopback and any free port.

What it serves, per content hash (a *root*):

- ``GET /v/{hash}/manifest``: the kind (``dir``/``file``), name, every file with its
  size, the empty dirs, and the state;
- ``POST /v/{hash}/bundle``: many small files in one response (``peer/bundle.py``);
- ``GET /v/{hash}/f/{relpath}``: one file, with its digest in ``X-Kinetic-Digest``,
  only once the file is whole.  The digest is the one the content hash takes of
  that file (sha256 of the relative path, a NUL and the bytes: ``file_digest``), so
  a getter that checked every file on arrival can hash the whole tree without
  reading it again.  A root still *receiving* (a broadcast child) holds
  a request for a file not yet there up to ``HOLD_S`` and then answers 503, so a
  child may read from a parent that is itself still reading.

Every request must carry the scope's token (``X-Kinetic-Peer-Token``); a wrong or
missing one gets 403 and no bytes.

Bounds (``Limits``): a connection must deliver a whole request head (its line and
headers) within ``header_s`` of opening or of its previous response, and may sit
``idle_s`` at most without a byte moving mid-request; then it is closed.  At most
``per_address`` connections from one peer address and ``total`` in all are served
at once (one thread each); a connection beyond them is answered 503 with
``X-Kinetic-Busy`` and closed at once by the accepting thread, with no thread of its
own (a getter backs off and asks again).  Before these, 200 half-open connections
held 200 threads for as long as their client liked.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO

from airflow_provider_kinetic.core.keys.peer import bundle as peerbundle
from airflow_provider_kinetic.core.keys.peer.registry import COMPLETE, FAILED, RECEIVING
from airflow_provider_kinetic.core.spec.peerport import POD_IP_ENV, PORT_ENV

log = logging.getLogger("kinetic.peers")

TOKEN_HEADER = "X-Kinetic-Peer-Token"
DIGEST_HEADER = "X-Kinetic-Digest"
#: How long the getter lets a request for a file still arriving be held (seconds).
HOLD_HEADER = "X-Kinetic-Hold"
#: On a 503: the bytes this copy has received so far (a parent that is itself
#: progressing is waited for; one whose count stands still is stalled).
RECEIVED_HEADER = "X-Kinetic-Received"
#: How long a request for a file that is still arriving is held before a 503.
HOLD_S = 5.0
CHUNK = 1 << 20
#: On a 503: the server is at its connection cap (not the content's state).
BUSY_HEADER = "X-Kinetic-Busy"
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


@dataclass
class Root:
    """One content hash this runner serves."""

    version: str
    kind: str
    name: str
    expected: list[tuple[str, int]]
    empty_dirs: list[str] = field(default_factory=list)
    state: str = COMPLETE
    #: relpath -> (absolute path, ``file_digest`` hex; "" until first served): the
    #: files that are whole.
    ready: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Bytes received so far (a receiving copy's progress, told to its children).
    received: int = 0

    def manifest(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "kind": self.kind,
            "name": self.name,
            "files": [list(f) for f in self.expected],
            "empty_dirs": self.empty_dirs,
            "state": self.state,
        }


class PeerServer:
    """The server thread and what it serves (one per runner process)."""

    def __init__(
        self,
        token: str,
        host: str | None = None,
        port: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.token = token
        self.limits = limits or Limits.from_env()
        self.roots: dict[str, Root] = {}
        self.changed = threading.Condition()
        #: (version, relpath) -> set when that file is whole (held requests wait on it).
        self._waiting: dict[tuple[str, str], threading.Event] = {}
        pod_ip = os.environ.get(POD_IP_ENV, "")
        bind = host or ("0.0.0.0" if pod_ip else "127.0.0.1")  # noqa: S104 - a pod's peers
        wanted = port if port is not None else int(os.environ.get(PORT_ENV) or 0)
        self.httpd = _bind(bind, wanted, self)
        self.address = f"{pod_ip or '127.0.0.1'}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="kinetic-peer-server", daemon=True
        )
        self.thread.start()
        log.info("peer server listening on %s", self.address)

    # ---- what is served -----------------------------------------------------------
    def add(self, root: Root) -> None:
        with self.changed:
            self.roots[root.version] = root
            self._wake(root.version)

    def progressed(self, version: str, nbytes: int) -> None:
        """``nbytes`` more of ``version`` arrived (from its own source)."""
        root = self.roots.get(version)
        if root is not None:
            root.received += nbytes

    def file_ready(self, version: str, rel: str, path: str, digest: str) -> None:
        with self.changed:
            root = self.roots.get(version)
            if root is not None:
                root.ready[rel] = (path, digest)
                event = self._waiting.pop((version, rel), None)
                if event is not None:  # only the requests for this file
                    event.set()

    def set_state(self, version: str, state: str, moved_to: dict[str, str] | None = None) -> None:
        """A root's new state; ``moved_to`` (relpath -> path) after a copy is placed."""
        with self.changed:
            root = self.roots.get(version)
            if root is not None:
                root.state = state
                for rel, path in (moved_to or {}).items():
                    if rel in root.ready:
                        root.ready[rel] = (path, root.ready[rel][1])
                self._wake(version)

    def remove(self, version: str) -> None:
        with self.changed:
            self.roots.pop(version, None)
            self._wake(version)

    def _wake(self, version: str) -> None:
        """Every request held for ``version`` looks again (its state changed)."""
        for held in [k for k in self._waiting if k[0] == version]:
            self._waiting.pop(held).set()
        self.changed.notify_all()

    def wait_file(self, version: str, rel: str, hold_s: float) -> tuple[str, str] | str:
        """The file's (path, digest) once whole, else why not (``missing``,
        ``failed``, ``later``)."""
        deadline = time.monotonic() + hold_s
        with self.changed:
            while not (ok := _settled(self.roots.get(version), rel)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # Woken for this file only: a file arriving wakes the requests held
                # for it, not every held request (a parent serving many children
                # holds dozens; waking them all per file starved its own download).
                event = self._waiting.setdefault((version, rel), threading.Event())
                self.changed.release()
                try:
                    event.wait(left)
                finally:
                    self.changed.acquire()
            root = self.roots.get(version)
            if root is None:
                return "missing"
            if rel in root.ready:
                return root.ready[rel]
            if not ok or root.state == RECEIVING:
                return "later"
            return "failed" if root.state == FAILED else "missing"

    def open_file(self, version: str, rel: str, hold_s: float) -> tuple[BinaryIO, str] | str:
        """The whole file, open, with its digest; else why not (as ``wait_file``, or
        ``gone``).  A copy is renamed into place a moment before its paths here are
        updated (``set_state``): a file missing at its old path is looked for at the
        new one rather than refused, or every child reading then would give up on
        this parent."""
        got = self.wait_file(version, rel, hold_s)
        if isinstance(got, str):
            return got
        path, digest = got
        for _ in range(2):
            try:
                if not digest:  # a published file: hashed on its first read, then kept
                    digest = file_digest(rel, path)
                    self.file_ready(version, rel, path, digest)
                return open(path, "rb"), digest  # noqa: SIM115 - the caller closes it
            except OSError:
                log.debug("%s/%s is not at %s: waiting for where it moved", version[:12], rel, path)
                with self.changed:
                    self.changed.wait_for(partial(self._moved, version, rel, path), hold_s)
                moved = self._path(version, rel)
                if moved is None or moved == path:
                    break
                path = moved
        return "gone"

    def received_of(self, version: str) -> int:
        """Bytes of ``version`` this copy has received so far (0: none, or not served)."""
        root = self.roots.get(version)
        return root.received if root is not None else 0

    def _moved(self, version: str, rel: str, path: str) -> bool:
        return self._path(version, rel) != path

    def _path(self, version: str, rel: str) -> str | None:
        root = self.roots.get(version)
        got = root.ready.get(rel) if root is not None else None
        return got[0] if got is not None else None

    @property
    def stats(self) -> ConnStats:
        return self.httpd.stats

    def close(self) -> None:
        """Stop accepting, and end the connections still open (their threads end)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.drop_all()
        self.thread.join(10)


def _settled(root: Root | None, rel: str) -> bool:
    return root is None or rel in root.ready or root.state != RECEIVING


def _bind(host: str, port: int, owner: PeerServer) -> ThreadingHTTPServer:
    try:
        httpd = _Httpd((host, port), _Handler)
    except OSError:
        if port == 0:
            raise
        log.info("peer port %d is taken on this host; using a free one", port)
        httpd = _Httpd((host, 0), _Handler)
    httpd.owner = owner
    return httpd


def digest_prefix(rel: str) -> bytes:
    """What the content hash puts before a file's bytes: its path in the tree (a
    lone file's name) and a NUL (``core/data/hashing``)."""
    return rel.encode() + b"\0"


def file_sha(rel: str, path: str) -> hashlib._Hash:
    """The content hash's digest of the file at ``path``, named ``rel`` in its tree
    (the hash object: a caller may record its bytes, ``FileDigests``)."""
    h = hashlib.sha256(digest_prefix(rel))
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h


def file_digest(rel: str, path: str) -> str:
    """``file_sha`` as hex, as the peers send it."""
    return file_sha(rel, path).hexdigest()


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    #: Connections waiting to be accepted: a parent's children open theirs at once
    #: (fanout x the getter's threads); the stdlib's 5 overflowed and reset some.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.stats = ConnStats()
        self._gate = threading.Condition()
        self._per_address: dict[str, int] = {}
        self._open: set[Any] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection if under the caps; else a 503 and closed here."""
        peer, limits = client_address[0], self.owner.limits
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

    owner: PeerServer


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

    def __init__(self, sock: Any, server: _Httpd) -> None:
        self.sock, self.server = sock, server
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        wait = self.server.owner.limits.idle_s
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
        try:
            if wait <= 0:
                raise TimeoutError("the request head did not arrive in time")
            self.sock.settimeout(wait)
            return self.sock.recv_into(buf)
        except TimeoutError:
            with self.server._gate:
                self.server.stats.timed_out += 1
            raise


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Httpd

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader, replaced (it holds the socket open)
        limits = self.server.owner.limits
        self.connection.settimeout(limits.idle_s)  # writes: a client that stopped reading
        self._reads = _Reads(self.connection, self.server)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        """One request; its head must be whole within ``header_s`` (a timeout closes
        the connection: the stdlib's own handling)."""
        self._reads.deadline = time.monotonic() + self.server.owner.limits.header_s
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._reads.deadline = None  # the head is in: the body and reply wait idle_s
        self.connection.settimeout(self.server.owner.limits.idle_s)
        return ok

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        log.debug("peer request: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        owner = self.server.owner
        if not self._authorised(owner):
            return
        parts = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).split("/", 4)
        if len(parts) >= 4 and parts[1] == "v" and parts[3] == "manifest":
            root = owner.roots.get(parts[2])
            if root is None:
                self._reply(404, b"")
                return
            self._reply(200, json.dumps(root.manifest()).encode(), "application/json")
            return
        if len(parts) == 5 and parts[1] == "v" and parts[3] == "f":
            self._file(owner, parts[2], parts[4])
            return
        self._reply(404, b"")

    def do_POST(self) -> None:  # noqa: N802 - stdlib's name
        """``/v/{hash}/bundle``: many small files in one response (``peer/bundle.py``)."""
        owner = self.server.owner
        if not self._authorised(owner):
            return
        parts = urllib.parse.urlsplit(self.path).path.split("/")
        try:
            length = int(self.headers.get("Content-Length") or -1)
            if len(parts) != 4 or parts[1] != "v" or parts[3] != "bundle":
                raise LookupError(self.path)
            if not 0 <= length <= peerbundle.MAX_BODY:
                raise ValueError(f"a bundle request of {length} bytes")
            rels = peerbundle.parse_request(self.rfile.read(length))
        except LookupError:
            self._reply(404, b"")
            return
        except ValueError as exc:
            self.close_connection = True
            self._reply(400, str(exc).encode())
            return
        peerbundle.write_bundle(self, owner, parts[2], rels, self._hold())

    def _authorised(self, owner: PeerServer) -> bool:
        given = self.headers.get(TOKEN_HEADER, "")
        if hmac.compare_digest(given.encode(), owner.token.encode()):
            return True
        self.close_connection = True
        self._reply(403, b"")
        return False

    def _hold(self) -> float:
        try:
            return min(HOLD_S, max(0.0, float(self.headers.get(HOLD_HEADER) or HOLD_S)))
        except ValueError:
            return HOLD_S

    def _file(self, owner: PeerServer, version: str, rel: str) -> None:
        got = owner.open_file(version, rel, self._hold())
        if isinstance(got, str):
            extra = {RECEIVED_HEADER: str(owner.received_of(version))}
            code = {"later": 503, "failed": 410, "gone": 410}.get(got, 404)
            self._reply(code, got.encode(), extra=extra)
            return
        f, digest = got
        with f:
            size = os.fstat(f.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header(DIGEST_HEADER, digest)
            self.end_headers()
            try:  # the kernel copies file to socket (no pass through Python)
                self.wfile.flush()
                sent = self.connection.sendfile(f)
                if sent != size:  # the file changed under us: the child's check fails it
                    self.close_connection = True
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    def _reply(
        self, code: int, body: bytes, ctype: str = "text/plain", extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


_lock = threading.Lock()
_server: PeerServer | None = None


def server(token: str) -> PeerServer:
    """This process's peer server, started on first use."""
    global _server
    with _lock:
        if _server is None:
            _server = PeerServer(token)
        return _server


def running() -> PeerServer | None:
    """The server if one was started (the runner's end asks, starting nothing)."""
    return _server


def stop() -> None:
    """Stop this process's server (the runner's end, after unregistering)."""
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None
