"""What a broadcast copy must be, known without asking any peer, and a parent's
file list checked against it before a byte of a file is read.

A parent is not trusted (``broadcast.py``): its list must be the version's (the
key's record: its file count and bytes; a Data's: the store's listing), or the
parent is ``PeerLied`` and the getter reads elsewhere.  A parent that has not
started serving yet (404) or is at its connection cap (503 busy) is asked again
until the broadcast window's timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.keys.peer.conn import peer_manifest
from airflow_provider_kinetic.core.keys.peer.errors import PeerBusy, PeerLied, PeerNotServing
from airflow_provider_kinetic.core.keys.records import Version


@dataclass(frozen=True)
class Expected:
    """What a copy must be, known without asking any peer: a parent's list is
    checked against it before a byte of a file is read (a parent that claimed ten
    times the bytes was read ten times over)."""

    #: The version's file count and bytes (a key's record).
    files: int
    size: int
    #: ``[[relpath, size], ...]`` when known file by file (a file key: its one file;
    #: a Data: the store's listing), else None.
    listing: list[list[Any]] | None = None

    @classmethod
    def of_key(cls, v: Version) -> Expected:
        listing = [[v.name, v.size]] if v.kind == "file" else None
        return cls(v.files, v.size, listing)

    @classmethod
    def of_listing(cls, listing: list[list[Any]]) -> Expected:
        return cls(len(listing), sum(int(f[1]) for f in listing), listing)

    def check(self, address: str, files: Any) -> list[list[Any]]:
        """``files`` from the parent at ``address`` if they can be this content;
        ``PeerLied`` naming the peer and the difference otherwise."""
        if not isinstance(files, list) or not all(
            isinstance(f, list)
            and len(f) == 2
            and isinstance(f[0], str)
            and type(f[1]) is int
            and f[1] >= 0
            for f in files
        ):
            raise PeerLied(f"peer {address} listed files not as [[path, size], ...]: refused")
        rels = [f[0] for f in files]
        if len(set(rels)) != len(rels):
            raise PeerLied(f"peer {address} listed a file twice: refused")
        total = sum(f[1] for f in files)
        if len(files) != self.files or total != self.size:
            raise PeerLied(
                f"peer {address} listed {len(files)} file(s) of {total} bytes; the version "
                f"has {self.files} of {self.size}: refused"
            )
        if self.listing is not None and sorted(files) != sorted(self.listing):
            wrong = sorted(map(tuple, files))[:3]
            raise PeerLied(
                f"peer {address} listed files or sizes other than the version's "
                f"(such as {wrong}): refused"
            )
        return [list(f) for f in files]


def parent_files(
    expected: Expected, address: str, version: str, token: str, timeout_s: float
) -> list[list[Any]]:
    """The file list of the parent at ``address``, checked against ``expected``: it
    may not have joined its own source yet, so a 404 (or a busy 503) is asked again
    until ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            manifest = peer_manifest(address, version, token, timeout_s)
            files = manifest.get("files") if isinstance(manifest, dict) else None
            return expected.check(address, files)
        except (PeerNotServing, PeerBusy):
            if time.monotonic() >= end:
                raise
            # A short wait between two asks of a parent that has not started yet.
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
