"""Key and path helpers shared by the GCS and local stores (stdlib only).

Both stores validate keys the same way so that a key accepted by the local store
rehearsal is also accepted by GCS, and an object name that would escape a download
directory (``..``, absolute paths) is refused by both instead of being written
outside ``local_dir``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

#: Where a big file's parallel parts wait to be composed into one object (deleted
#: after the compose, whatever happens; ``data gc`` removes what a killed client left).
PARTS_PREFIX = ".kinetic-parts"


def dir_prefix(prefix: str) -> str:
    """``prefix`` as a "directory": ``"a/b"`` and ``"a/b/"`` -> ``"a/b/"``; ``""`` -> ``""``.

    ``download_prefix``/``delete_prefix`` use it so that ``jobs/abc`` never matches
    ``jobs/abcd/...``.
    """
    stripped = prefix.rstrip("/")
    return stripped + "/" if stripped else ""


def join_key(prefix: str, rel: str) -> str:
    """``prefix/rel`` with exactly one separator (``rel`` alone for an empty prefix)."""
    stripped = prefix.rstrip("/")
    return f"{stripped}/{rel}" if stripped else rel


def safe_relpath(rel: str) -> str:
    """Normalise a relative path to a ``/``-separated key suffix, refusing escapes.

    Raises ``ValueError`` for absolute paths, ``..`` components and empty names, which
    would either leave the target directory or map to no file at all.
    """
    posix = rel.replace(os.sep, "/") if os.sep != "/" else rel
    parts = [p for p in posix.split("/") if p not in ("", ".")]
    if posix.startswith("/") or not parts or ".." in parts:
        raise ValueError(f"unsafe relative path for an object store: {rel!r}")
    return "/".join(parts)


def materialise(relpaths: Iterable[str]) -> list[str]:
    """The relative paths as a list of safe keys, order preserved (generators allowed)."""
    return [safe_relpath(r) for r in relpaths]
