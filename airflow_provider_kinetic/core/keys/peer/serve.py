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

Bounds on connections (admission caps, header and idle timeouts: ``Limits``) are
``peer/bounds.py``'s; the headers and the per-file digest, ``peer/protocol.py``'s.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from functools import partial
from typing import Any, BinaryIO

from airflow_provider_kinetic.core.keys.peer import bundle as peerbundle
from airflow_provider_kinetic.core.keys.peer.bounds import (
    BoundedHandler,
    BoundedServer,
    ConnStats,
    Limits,
)
from airflow_provider_kinetic.core.keys.peer.protocol import (
    DIGEST_HEADER,
    HOLD_HEADER,
    HOLD_S,
    RECEIVED_HEADER,
    TOKEN_HEADER,
    file_digest,
)
from airflow_provider_kinetic.core.keys.peer.registry import COMPLETE, FAILED, RECEIVING
from airflow_provider_kinetic.core.spec.peerport import POD_IP_ENV, PORT_ENV

log = logging.getLogger("kinetic.peers")


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


def _bind(host: str, port: int, owner: PeerServer) -> _Httpd:
    try:
        httpd = _Httpd((host, port), _Handler, owner.limits)
    except OSError:
        if port == 0:
            raise
        log.info("peer port %d is taken on this host; using a free one", port)
        httpd = _Httpd((host, 0), _Handler, owner.limits)
    httpd.owner = owner
    return httpd


class _Httpd(BoundedServer):
    """The bounded server, with the ``PeerServer`` whose roots its handlers serve."""

    owner: PeerServer


class _Handler(BoundedHandler):
    server: _Httpd

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
