"""The receiving directory: where a copy's files land, from a peer or the store.

Both sources fill it the same way, so a broadcast child can switch source half way
(its parent died) and keep what it has: each file is written under a temporary name
(``part_of``), its digest taken while it streams, and put in its place only when
whole and checked (``kept``), which records the digest with the file's stat in the
caller's ``FileDigests``: the tree check then reads no file a second time (on 2 CPUs
and 16 copies of 1 GiB, that second read was a large part of a broadcast's time).
``missing`` is what a next source still has to send; ``drop_others`` removes what
a wrong list left behind.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable
from typing import Any, BinaryIO

from airflow_provider_kinetic.core.keys.peer.errors import PeerUnavailable
from airflow_provider_kinetic.core.keys.peer.protocol import digest_prefix
from airflow_provider_kinetic.core.storage.base import FileDigests

#: Told of every whole file: (relpath, its path, its digest as hex).
OnFile = Callable[[str, str, str], None]


def _done(base: str, rel: str, size: int) -> bool:
    path = os.path.join(base, *rel.split("/"))
    return os.path.isfile(path) and os.path.getsize(path) == size


def missing(base: str, files: list[list[Any]]) -> list[list[Any]]:
    """The files not yet whole in ``base``."""
    return [f for f in files if not _done(base, f[0], int(f[1]))]


def drop_others(base: str, files: list[list[Any]]) -> None:
    """Remove what is in ``base`` but not in ``files`` (a parent's list was wrong)."""
    keep = {f[0] for f in files}
    for top, _, names in os.walk(base):
        for name in names:
            path = os.path.join(top, name)
            if os.path.relpath(path, base).replace(os.sep, "/") not in keep:
                os.unlink(path)


def tree_digests() -> FileDigests:
    """Where a copy's per-file digests go, for the tree check (``fetch.place_version``)."""
    return FileDigests(digest_prefix)


def kept(
    part: str, path: str, rel: str, digest: hashlib._Hash, digests: FileDigests | None
) -> None:
    """``part`` is whole and checked: put it in place and remember its digest."""
    os.replace(part, path)
    if digests is not None:  # the stat after the rename (a rename changes ctime)
        digests.record(path, digest_prefix(rel), digest.digest(), os.stat(path))


_parts = itertools.count()
#: Directories already made (a copy's thousands of files share a few): each costs a
#: system call per file otherwise.
_made: set[str] = set()


def part_of(base: str, rel: str) -> tuple[str, str]:
    """The file's place in ``base`` and its temporary name; a path from a peer's
    list that would leave ``base`` is refused (the list is not trusted)."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PeerUnavailable(f"a peer listed the path {rel!r}, which is not relative: refused")
    path = os.path.join(base, *parts)
    parent = os.path.dirname(path)
    if parent not in _made:  # (removed since: the open makes it again, ``open_part``)
        os.makedirs(parent, exist_ok=True)
        _made.add(parent)
    return path, f"{path}.{os.getpid()}-{next(_parts)}.kinetic-part"


def open_part(part: str) -> BinaryIO:
    """``part`` open for writing, its directory made again if it was removed."""
    try:
        return open(part, "wb")  # noqa: SIM115 - the caller's with closes it
    except FileNotFoundError:
        os.makedirs(os.path.dirname(part), exist_ok=True)
        return open(part, "wb")  # noqa: SIM115
