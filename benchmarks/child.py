"""Times one content hash in a fresh process: ``child.py {ours|kinetic|lstat} PATH``.

Prints one JSON line: the seconds the hash took (imports excluded: a DAG run's worker
has them loaded), the hash, and for ours how many files were read (0 = a stat cache
hit).  Ours uses the stat cache in ``$KINETIC_STATCACHE_DIR``.  ``lstat`` times no
hash but the floor of a re-hash in Python that must notice a changed file: one
``os.lstat`` per file, by name relative to an open directory, the names listed
beforehand (ours goes below it where its C extension is built).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    side, path = sys.argv[1], sys.argv[2]
    read = [0]
    if side == "ours":
        from airflow_provider_kinetic.core.data import (
            Data,
            schemes,  # noqa: F401
        )
        from airflow_provider_kinetic.core.data.hashing import filedigest, treehash  # noqa: F401

        real = filedigest._digest_open  # every file read goes through it

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            read[0] += 1
            return real(*args, **kwargs)

        filedigest._digest_open = counting
        start = time.perf_counter()
        digest = Data(path).content_hash()
    elif side == "lstat":
        import os

        dirs = [(d, sorted(f)) for d, _, f in os.walk(path)]
        fds = [
            (os.open(d, os.O_RDONLY | os.O_DIRECTORY), [os.fsencode(n) for n in f]) for d, f in dirs
        ]
        lstat = os.lstat
        start = time.perf_counter()
        for fd, names in fds:
            for name in names:
                lstat(name, dir_fd=fd)
        digest = ""
    else:
        import kinetic_ref

        kdata = kinetic_ref.load("data.data")
        start = time.perf_counter()
        digest = kdata.Data(path).content_hash()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "hash": digest, "files_read": read[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
