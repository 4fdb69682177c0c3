"""Bundles: many small files of one content hash in one peer response.

Why: a broadcast of 2,000 files of 512 KiB moved every file in a request of its own,
and the Python on both ends of each request (parsing, a handler thread's wake-up,
the response's headers) cost a hop more than the bytes did: on 2 CPUs a hop of small
files took about twice as long as one file of the same size.  A getter now asks for
up to ``BUNDLE_FILES`` consecutive small files at once (``POST /v/{hash}/bundle``,
the relative paths as JSON) and the parent streams them in that order as each
becomes whole, in one response that ends with the connection (no length and no
chunked encoding: the getter's reads are then the socket file's own, in C, instead of
http.client's chunk decoding in Python, which cost a copy as much CPU as the bytes):

- per file, a JSON header line ``{"rel", "size", "digest"}`` (the same digest as the
  one-file request's header, ``protocol.file_digest``), then exactly ``size`` bytes
  (sent by the kernel, ``sendfile``);
- a file the parent does not have within the getter's hold ends the response with
  ``{"stop": "later", "received": N}``: the getter asks again for the rest (the
  parent's progress tells it the parent is not stalled); ``failed``, ``missing`` or
  ``gone`` end it for good, and the getter tries its next source;
- ``{"stop": "end"}`` after the last file: a connection that ends without it (or in
  the middle of a file) is a broken one, never a short bundle.

Every file is checked on arrival as in a one-file request; the tree is checked after.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Protocol

#: Files up to this size travel in bundles; a bigger one has a request of its own.
BUNDLE_FILE_MAX = 4 << 20
#: At most this many files, and about this many bytes, per bundle.
BUNDLE_FILES = 64
BUNDLE_BYTES = 32 << 20
CONTENT_TYPE = "application/x-kinetic-bundle"
#: The most a bundle request's body (its list of paths) may hold.
MAX_BODY = 1 << 20


class _Opener(Protocol):
    def open_file(self, version: str, rel: str, hold_s: float) -> Any: ...

    def received_of(self, version: str) -> int: ...


def plan(files: list[list[Any]]) -> tuple[list[list[list[Any]]], list[list[Any]]]:
    """``files`` (``[rel, size]`` in order) as bundles of consecutive small files, and
    the big files that go one per request."""
    bundles: list[list[list[Any]]] = []
    singles: list[list[Any]] = []
    current: list[list[Any]] = []
    nbytes = 0
    for entry in files:
        size = int(entry[1])
        if size > BUNDLE_FILE_MAX:
            singles.append(entry)
            continue
        if current and (len(current) >= BUNDLE_FILES or nbytes + size > BUNDLE_BYTES):
            bundles.append(current)
            current, nbytes = [], 0
        current.append(entry)
        nbytes += size
    if current:
        bundles.append(current)
    return bundles, singles


def parse_request(body: bytes) -> list[str]:
    """The paths a bundle request asks for; ``ValueError`` for anything else."""
    rels = json.loads(body).get("files")
    if not isinstance(rels, list) or not all(isinstance(r, str) for r in rels):
        raise ValueError("a bundle request names its files as a list of paths")
    return rels


def write_bundle(handler: Any, owner: _Opener, version: str, rels: list[str], hold: float) -> None:
    """Answer a bundle request on ``handler`` (a ``BaseHTTPRequestHandler``)."""
    handler.send_response(200)
    handler.send_header("Content-Type", CONTENT_TYPE)
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    with contextlib.suppress(TimeoutError, BrokenPipeError, ConnectionResetError):
        _frames(handler, owner, version, rels, hold)  # (a getter that left: nothing to do)


def _frames(handler: Any, owner: _Opener, version: str, rels: list[str], hold: float) -> None:
    out = handler.wfile
    for rel in rels:
        got = owner.open_file(version, rel, hold)
        if isinstance(got, str):
            out.write(_line({"stop": got, "received": owner.received_of(version)}))
            return
        f, digest = got
        with f:
            size = os.fstat(f.fileno()).st_size
            out.write(_line({"rel": rel, "size": size, "digest": digest}))
            if size and handler.connection.sendfile(f) != size:
                return  # changed under us: the connection ends mid-file, so it is broken
    out.write(_line({"stop": "end"}))


def read_header(resp: Any) -> dict[str, Any]:
    """The next frame's header (``{"stop": "cut"}`` when the connection ended)."""
    line = resp.readline(1 << 16)
    if not line.endswith(b"\n"):
        return {"stop": "cut"}
    head = json.loads(line)
    if not isinstance(head, dict):
        raise ValueError(f"a bundle frame header that is not an object: {line[:80]!r}")
    return head


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
