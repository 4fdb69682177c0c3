"""What both ends of a peer transfer agree on: the headers, the hold on a file
still arriving, and the per-file digest.

The server (``serve.py``), the getter (``fetch.py``) and the store read
(``storepull.py``) all take a file's digest the way the content hash does (sha256
of the relative path, a NUL and the bytes: ``file_digest``), so a getter that
checked every file on arrival can hash the whole tree without reading it again.
"""

from __future__ import annotations

import hashlib

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
