"""Volume mount paths: refused before anything is uploaded when they could hurt.

On GKE a mount path is a path in the container; on the local backend it is a real
path on the Airflow worker, so a mount at ``/etc`` would write onto the host.  The
same rules hold on every backend, so a DAG that passes locally passes on GKE.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

#: System trees a volume may not be mounted at or under.
SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys",
    "/usr", "/var",
)  # fmt: skip
#: Paths a volume may not be mounted at exactly (their subdirectories are fine).
EXACT = ("/", "/tmp", "/home", "/root")


def check_mount_paths(paths: Iterable[str], reserved: str) -> dict[str, str]:
    """Normalised path for each mount path; ``ValueError`` naming the first bad one.

    Refused: relative paths, any ``..`` component, ``/`` and the system trees, the
    reserved FUSE root, duplicates after normalisation, and a mount nested in another.
    """
    normal: dict[str, str] = {}
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(
                f"volume mount path {path!r} must be an absolute path (starting with '/')"
            )
        if ".." in path.split("/"):
            raise ValueError(f"volume mount path {path!r} contains '..'; write the path plainly")
        norm = posixpath.normpath(path)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        if norm in EXACT:
            raise ValueError(f"volume mount path {path!r} would hide {norm!r}; mount under it")
        system = next((d for d in SYSTEM_DIRS if norm == d or norm.startswith(d + "/")), None)
        if system is not None:
            raise ValueError(
                f"volume mount path {path!r} is inside the system directory {system}; "
                f"not allowed: {', '.join(SYSTEM_DIRS)}"
            )
        if norm == reserved or norm.startswith(reserved + "/"):
            raise ValueError(f"volume mount path {path!r} is reserved ({reserved}/...)")
        for other_raw, other in normal.items():
            if other == norm:
                raise ValueError(
                    f"volume mount paths {other_raw!r} and {path!r} are the same path {norm!r}"
                )
            if norm.startswith(other + "/") or other.startswith(norm + "/"):
                raise ValueError(
                    f"volume mount paths {other_raw!r} and {path!r} are nested: one would "
                    "hide the other"
                )
        normal[path] = norm
    return normal
