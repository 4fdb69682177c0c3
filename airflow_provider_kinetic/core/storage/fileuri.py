"""The one rule for ``file://`` URIs, written and read everywhere (stdlib only).

A ``file://`` URI names an absolute local path: ``file://`` + the path's bytes
percent-encoded (``urllib.parse.quote``'s rule, keeping ``/``).  Reading one decodes
the whole rest (``unquote``), so a space, ``%``, ``#``, ``?`` or a non-ASCII name
round-trips exactly: an output dir the store names, the path a job writes it at, and
the ``Data`` that reads it downstream are the same directory.  There is no query or
fragment: ``#`` and ``?`` are always encoded when written, and kept as path characters
when met raw (a URI an earlier version wrote without encoding reads as the same path
whenever it holds no ``%``: plain paths decode to themselves).  ``file://localhost/x``
is ``/x``; any other host, or a relative path, is refused.
"""

from __future__ import annotations

import os
import urllib.parse

__all__ = ["FILE_PREFIX", "file_uri", "file_uri_path"]

FILE_PREFIX = "file://"


def file_uri(path: str) -> str:
    """``file://`` + ``path`` (absolute) percent-encoded; bytes a file name holds that
    are not UTF-8 (``surrogateescape``) are encoded as the bytes they are."""
    return FILE_PREFIX + urllib.parse.quote_from_bytes(os.fsencode(path), safe="/")


def file_uri_path(uri: str) -> str:
    """The absolute path a ``file://`` URI names (percent-decoded); ``ValueError``
    naming the URI for another scheme, a host or a relative path."""
    if not uri.startswith(FILE_PREFIX):
        raise ValueError(f"not a file:// URI: {uri!r}")
    rest = uri[len(FILE_PREFIX) :]
    if rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    if not rest.startswith("/"):
        raise ValueError(
            f"file:// URI {uri!r} must be file:///absolute/path (no host, absolute path)"
        )
    return os.fsdecode(urllib.parse.unquote_to_bytes(os.fsencode(rest)))
