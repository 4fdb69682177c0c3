"""Reading a content hash's files from one peer, on a few threads: small ones in
bundles (``peer/bundle.py``), big ones one per request (the connection and the
manifest are ``peer/conn.py``'s).

Each file goes into the receiving directory (``peer/receiving.py``) under a
temporary name, its digest taken while it streams, and is kept only when whole and
of the digest the peer sent; ``on_file`` is told of every whole file, which is how a
child serves its own children while it is still receiving.  A peer is not trusted:
a body whose length is not the listed size is not read, and a wrong digest or a
longer body is ``PeerLied``.  A peer at its connection cap (503 busy) is asked
again after a short backoff; no progress for ``stall_s`` gives the peer up.  The
whole tree is checked against the content hash by the caller afterwards: nothing
here is trusted on its own.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_kinetic.core.keys.peer import bundle as peerbundle
from airflow_provider_kinetic.core.keys.peer.conn import connection
from airflow_provider_kinetic.core.keys.peer.errors import PeerForbidden, PeerLied, PeerUnavailable
from airflow_provider_kinetic.core.keys.peer.protocol import (
    BUSY_HEADER,
    CHUNK,
    DIGEST_HEADER,
    HOLD_HEADER,
    HOLD_S,
    RECEIVED_HEADER,
    TOKEN_HEADER,
    digest_prefix,
)
from airflow_provider_kinetic.core.keys.peer.receiving import OnFile, kept, open_part, part_of
from airflow_provider_kinetic.core.storage.base import FileDigests

#: Parallel reads from one peer: small files travel in bundles, each a stream of
#: its own; a peer is near, so a few hide its round trip, and more only contend for
#: the GIL.  The store's count is the store's own (``ObjectStore.workers_for``).
WORKERS = 4
#: A busy peer is asked again after this, doubled per refusal up to ``BUSY_MAX_S``.
BUSY_S = 0.05
BUSY_MAX_S = 1.0


class _PeerPull:
    """``files`` from one peer, in threads, each thread on its own kept-alive
    connection; any file that cannot be had within ``stall_s`` of the last progress
    makes the whole pull fail (the caller picks another source)."""

    def __init__(
        self,
        address: str,
        version: str,
        token: str,
        base: str,
        stall_s: float,
        digests: FileDigests | None = None,
    ) -> None:
        self.address, self.version, self.token = address, version, token
        self.base, self.stall_s, self.digests = base, stall_s, digests
        self.progress = time.monotonic()
        self.failed = threading.Event()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.parent_seen: str | None = None
        #: Told of every chunk received (a parent's children see it as progress).
        self.on_bytes: Callable[[int], None] = lambda _n: None
        #: Refusals in a row at the peer's connection cap (the next wait doubles).
        self.busy = 0

    def conn(self) -> http.client.HTTPConnection:
        c = getattr(self.local, "conn", None)
        if c is None:  # reads wait out a held request, plus the stall allowance
            c = self.local.conn = connection(self.address, self.stall_s + HOLD_S)
        return c

    def done(self, task: Callable[..., int], *args: Any) -> int:
        """Run one task, then close this thread's connection: a connection kept
        open while its thread waits for nothing would hold one of the peer's
        per-address slots (``bounds.Limits``) that another reader is waiting for."""
        try:
            return task(*args)
        finally:
            conn, self.local.conn = getattr(self.local, "conn", None), None
            if conn is not None:
                conn.close()

    def parent_progress(self, received: str | None) -> None:
        """A parent whose own copy grew since we last asked is not stalled."""
        with self.lock:
            if received is not None and received != self.parent_seen:
                self.parent_seen = received
                self.progress = time.monotonic()

    def hold(self) -> str:
        """How long the parent may hold a request for a file it does not have yet."""
        left = self.stall_s - (time.monotonic() - self.progress)
        return f"{max(0.05, min(HOLD_S, left)):.2f}"

    def broken(self, exc: OSError, what: str = "") -> PeerUnavailable:
        """The connection failed: this peer is given up (the caller tries another)."""
        self.local.conn = None
        self.failed.set()
        return PeerUnavailable(f"peer {self.address}: {what}{exc}")

    def stall(self) -> PeerUnavailable:
        self.failed.set()
        self.local.conn = None
        return PeerUnavailable(
            f"peer {self.address}: no progress for {self.stall_s:.0f}s (stalled or gone)"
        )

    def stalled(self) -> bool:
        return self.failed.is_set() or time.monotonic() - self.progress > self.stall_s

    def was_busy(self, resp: http.client.HTTPResponse) -> bool:
        """A 503 from the peer's connection cap: wait a little (the peer closed this
        connection; the next request opens another).  Busy for ``stall_s`` is a stall."""
        if resp.status != 503 or not resp.getheader(BUSY_HEADER):
            self.busy = 0
            return False
        resp.read()
        self.local.conn = None
        self.busy += 1
        time.sleep(min(BUSY_MAX_S, BUSY_S * 2 ** min(self.busy, 8)))
        return True

    def lied(self, what: str) -> PeerLied:
        """The peer sent what cannot be the content: nothing more is read from it."""
        self.failed.set()
        conn, self.local.conn = getattr(self.local, "conn", None), None
        if conn is not None:
            conn.close()
        return PeerLied(f"peer {self.address} {what}")

    def one(self, entry: list[Any], on_file: OnFile) -> int:
        rel, size = entry[0], int(entry[1])
        url = f"/v/{self.version}/f/{urllib.parse.quote(rel)}"
        while not self.stalled():
            resp = self._ask("GET", url)
            if self.was_busy(resp):
                continue
            if resp.status == 503:  # the parent is still receiving it
                resp.read()
                self.parent_progress(resp.getheader(RECEIVED_HEADER))
                continue
            self._refused(resp, rel)
            if resp.length != size:  # checked before a byte of it is read
                raise self.lied(
                    f"sent {rel} as {resp.length if resp.length is not None else 'an unbounded'}"
                    f" byte body where the list has {size} bytes: not read"
                )
            self._receive(resp, rel, size, resp.getheader(DIGEST_HEADER, ""), on_file)
            self._end(resp)
            return size
        raise self.stall()

    def bundle(self, entries: list[list[Any]], on_file: OnFile) -> int:
        """Small files in as few requests as the parent's progress allows: a bundle
        that stops at a file the parent does not have yet is asked again from there."""
        todo, total = list(entries), 0
        while todo:
            if self.stalled():
                raise self.stall()
            body = json.dumps({"files": [e[0] for e in todo]}).encode()
            resp = self._ask("POST", f"/v/{self.version}/bundle", body)
            if self.was_busy(resp):
                continue
            self._refused(resp, todo[0][0])
            while todo:
                try:
                    head = peerbundle.read_header(resp)
                except TimeoutError as exc:
                    raise self.stall() from exc
                except (OSError, ValueError, http.client.HTTPException) as exc:
                    raise self.broken(OSError(str(exc)), "a bundle: ") from exc
                stop = head.get("stop")
                if stop == "later":
                    self.parent_progress(str(head.get("received")))
                    break
                rel, size = todo[0][0], int(todo[0][1])
                if stop is not None:
                    self.failed.set()
                    raise PeerUnavailable(
                        f"peer {self.address} answered {stop!r} where {rel} "
                        f"({size} bytes) was asked in a bundle"
                    )
                if head.get("rel") != rel or head.get("size") != size:
                    raise self.lied(
                        f"sent {head!r} where {rel} ({size} bytes) was asked in a bundle"
                    )
                self._receive(resp, rel, size, str(head.get("digest", "")), on_file)
                todo.pop(0)
                total += size
            if not todo and peerbundle.read_header(resp).get("stop") != "end":
                raise self.broken(OSError("no end after the last file"), "a bundle: ")
            resp.close()  # the parent ends the connection after a bundle
        return total

    def _ask(self, method: str, url: str, body: bytes | None = None) -> http.client.HTTPResponse:
        headers = {TOKEN_HEADER: self.token, HOLD_HEADER: self.hold()}
        try:
            c = self.conn()
            reused = c.sock is not None
            try:
                c.request(method, url, body=body, headers=headers)
                return c.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    # A peer at its cap answers "busy" and closes before our request
                    # is sent: its answer is still there to read.
                    if (resp := _answer_anyway(c)) is not None:
                        return resp
                    raise
                # A kept-alive connection the peer closed while it sat idle (its
                # ``header_s``): asked again once, on a new one.
                c.close()
                c.request(method, url, body=body, headers=headers)
                return c.getresponse()
        except TimeoutError as exc:
            raise self.stall() from exc
        except OSError as exc:
            raise self.broken(exc) from exc

    def _refused(self, resp: http.client.HTTPResponse, rel: str) -> None:
        """Raise unless the peer answered 200."""
        if resp.status == 200:
            return
        resp.read()
        self.failed.set()
        what = "refused our token" if resp.status == 403 else f"answered {resp.status}"
        raise (PeerForbidden if resp.status == 403 else PeerUnavailable)(
            f"peer {self.address} {what} for {rel}"
        )

    def _end(self, resp: http.client.HTTPResponse) -> None:
        """The response is over once its listed bytes are read: anything the peer
        says is left is not read (it would be bytes beyond the file's size)."""
        if resp.length:
            raise self.lied(f"had {resp.length} bytes more to send than listed: not read")
        try:
            resp.read()  # nothing left: marks the response done (the connection is reused)
        except (OSError, http.client.HTTPException) as exc:
            raise self.broken(OSError(str(exc)), "a response's end: ") from exc

    def _receive(
        self, resp: http.client.HTTPResponse, rel: str, size: int, sent: str, on_file: OnFile
    ) -> None:
        """Exactly ``size`` bytes of ``rel`` from ``resp``, kept only if whole and
        of the digest the peer ``sent``."""
        path, part = part_of(self.base, rel)
        h, got = hashlib.sha256(digest_prefix(rel)), 0
        try:
            with open_part(part) as f:
                while got < size and (chunk := resp.read(min(CHUNK, size - got))):
                    f.write(chunk)
                    h.update(chunk)
                    got += len(chunk)
                    self.progress = time.monotonic()
                    self.on_bytes(len(chunk))
            if got != size:  # the connection ended early (a parent that died)
                raise self.broken(OSError(f"{got} of {size} bytes arrived"), f"{rel}: ")
            if h.hexdigest() != sent:
                raise self.lied(f"sent {rel} with a digest other than the peer's: not kept")
            kept(part, path, rel, h, self.digests)
        except TimeoutError as exc:
            raise self.stall() from exc
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, PeerUnavailable):
                raise
            raise self.broken(OSError(str(exc)), f"{rel}: ") from exc
        finally:
            if os.path.exists(part):
                os.unlink(part)
        on_file(rel, path, h.hexdigest())


def _answer_anyway(c: http.client.HTTPConnection) -> http.client.HTTPResponse | None:
    """The response the peer sent before it closed, if any (our send failed)."""
    try:
        return c.getresponse()
    except (OSError, http.client.HTTPException):
        return None


def pull_peer(
    address: str,
    version: str,
    token: str,
    base: str,
    files: list[list[Any]],
    on_file: OnFile,
    stall_s: float,
    on_bytes: Callable[[int], None] | None = None,
    digests: FileDigests | None = None,
) -> int:
    """Read ``files`` from the peer at ``address``; bytes read.  Raises
    ``PeerUnavailable`` on the first file that fails or stalls (what arrived whole
    stays in ``base``).  ``on_bytes`` is told of every chunk as it arrives."""
    pull = _PeerPull(address, version, token, base, stall_s, digests)
    if on_bytes is not None:
        pull.on_bytes = on_bytes
    bundles, singles = peerbundle.plan(files)
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="kinetic-peer-get") as pool:
        futures = [pool.submit(pull.done, pull.bundle, b, on_file) for b in bundles]
        futures += [pool.submit(pull.done, pull.one, f, on_file) for f in singles]
        total, error = 0, None
        for fut in futures:
            try:
                total += fut.result()
            except PeerUnavailable as exc:
                error = error or exc
    if error is not None:
        raise error
    return total
