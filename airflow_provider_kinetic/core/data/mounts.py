"""Volume mounts: where Data is mounted, and the paths refused before any upload.

A ``FuseMount`` is a ``gs://`` Data mounted with the GCS FUSE CSI driver (made by the
Data schemes, turned into pod volumes by ``core/spec/pod.py``).  Mount paths are
refused before anything is uploaded when they could hurt.

On GKE a mount path is a path in the container; on the local backend it is a real
path on the Airflow worker, so a mount at ``/etc`` would write onto the host.  The
same rules hold on every backend, so a DAG that passes locally passes on GKE.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

#: Where FUSE data without a volume path is mounted in the pod (reserved for it).
FUSE_ROOT = "/_kinetic/fuse-data"

#: System trees a volume may not be mounted at or under.
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
)
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


@dataclass(frozen=True)
class FuseMount:
    """One GCS FUSE mount: ``gs://bucket/prefix`` at ``mount_path``."""

    uri: str
    mount_path: str
    is_dir: bool

    @property
    def bucket(self) -> str:
        return self.uri[len("gs://") :].split("/", 1)[0]

    @property
    def only_dir(self) -> str:
        """Prefix mounted: the directory itself, or a single file's parent."""
        rest = self.uri[len("gs://") :].split("/", 1)
        prefix = rest[1].rstrip("/") if len(rest) > 1 else ""
        if not self.is_dir and prefix:
            prefix = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        return prefix
