"""Reaching a peer: the connection a getter opens to it, and the one request that
is not a transfer, the peer's manifest of a content hash (asked before any file).

A connection must open within ``CONNECT_S`` (a network policy that drops pod-to-pod
packets shows up here, not as a long hang); its reads then wait as long as the
caller allows.  The manifest's answers map to the ``PeerUnavailable`` family
(``peer/errors.py``): 403 forbidden, 503 busy, 404 not serving (yet).
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any

from airflow_provider_kinetic.core.keys.peer.errors import (
    PeerBusy,
    PeerForbidden,
    PeerNotServing,
    PeerUnavailable,
)
from airflow_provider_kinetic.core.keys.peer.protocol import BUSY_HEADER, TOKEN_HEADER

#: Seconds to open a connection to a peer (a network policy that drops pod-to-pod
#: packets shows up here); ``KINETIC_PEER_CONNECT_S`` changes it.
CONNECT_S = 5.0
CONNECT_ENV = "KINETIC_PEER_CONNECT_S"


class _Conn(http.client.HTTPConnection):
    """Connects within ``CONNECT_S``, then reads with the caller's (longer) timeout."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=min(timeout, connect_s()))
        self.read_timeout = timeout

    def connect(self) -> None:
        super().connect()
        assert self.sock is not None
        self.sock.settimeout(self.read_timeout)


def connect_s() -> float:
    """Seconds to open a connection to a peer (``CONNECT_S`` unless the env says)."""
    return float(os.environ.get(CONNECT_ENV) or CONNECT_S)


def connection(address: str, timeout: float) -> http.client.HTTPConnection:
    """A connection to ``address`` (``host:port``), not opened yet."""
    host, _, port = address.rpartition(":")
    return _Conn(host, int(port), timeout)


def peer_manifest(address: str, version: str, token: str, timeout: float) -> dict[str, Any]:
    """The peer's manifest of ``version``; ``PeerUnavailable`` when it has none."""
    try:
        conn = connection(address, timeout)
        try:
            conn.request("GET", f"/v/{version}/manifest", headers={TOKEN_HEADER: token})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    except OSError as exc:
        raise PeerUnavailable(f"peer {address}: {exc}") from exc
    if resp.status == 403:
        raise PeerForbidden(f"peer {address} refused our token (403)")
    if resp.status == 503 and resp.getheader(BUSY_HEADER):
        raise PeerBusy(f"peer {address} is at its connection cap (503)")
    if resp.status == 404:
        raise PeerNotServing(f"peer {address} does not serve {version[:12]} (404)")
    if resp.status != 200:
        raise PeerUnavailable(f"peer {address} does not serve {version[:12]} ({resp.status})")
    return json.loads(body)
