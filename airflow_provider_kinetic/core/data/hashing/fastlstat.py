"""Compare a directory's files with their stat cache record: natively when built.

A re-hash of unchanged data is one ``lstat`` per file (``core/data/hashing/treehash.py``), and in
Python building each ``os.stat_result`` costs about as much as the system call.  The
optional extension ``_lstatcmp`` (``core/data/hashing/_lstatcmp.c``, built by ``setup.py`` where a
C compiler exists) makes only the system calls and compares in place, with the GIL
released.  Without it, :func:`compare` returns None and callers take the Python path,
which decides the same.  Stdlib only.
"""

from __future__ import annotations

import os
from array import array

try:
    from airflow_provider_kinetic.core.data.hashing import _lstatcmp
except ImportError:  # not built (no compiler, another platform): the Python path
    _lstatcmp = None  # type: ignore[assignment]

#: ``$KINETIC_NATIVE_LSTAT=0`` turns the native path off (to compare the two).
ENV_OFF = "KINETIC_NATIVE_LSTAT"
SAME, DIFFERENT, GONE = 1, 0, -1


def available() -> bool:
    """Whether the native comparison is built and switched on."""
    return _lstatcmp is not None and os.environ.get(ENV_OFF, "1") != "0"


def compare(
    fd: int, names: list[bytes] | list[str], inodes: array, numbers: array, start: int
) -> int | None:
    """``SAME`` when every file in ``names`` (relative to ``fd``) has the recorded
    ``(inode, size, mtime_ns, ctime_ns)`` (from index ``start`` of the record's
    arrays), ``DIFFERENT`` when one differs, ``GONE`` when one cannot be ``lstat``-ed;
    None when the native path cannot answer (not built, or names are not bytes)."""
    if not available() or (names and not isinstance(names[0], bytes)):
        return None
    return _lstatcmp.compare(fd, names, inodes, numbers, start)
