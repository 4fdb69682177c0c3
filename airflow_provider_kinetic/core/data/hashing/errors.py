"""The errors a Data path's hash raises, and their messages (stdlib only).

Both the walk (``treewalk.py``) and the file reads (``filedigest.py``) raise them, so
they live below both.  Each message names the Data path as the user wrote it and the
entry at fault.  ``treewalk`` re-exports them (and ``core.data``).
"""

from __future__ import annotations

from stat import filemode

from airflow_provider_kinetic.core.errors import KineticError


class DataPathError(KineticError, ValueError):
    """A Data path is, or contains, something that is not a file or a directory."""


class DataReadError(KineticError, OSError):
    """A file or directory of a Data path cannot be read (permissions, I/O error)."""


def _kind(mode: int) -> str:
    return {"p": "a FIFO", "s": "a socket", "c": "a character device", "b": "a block device"}.get(
        filemode(mode)[0], f"not a regular file (mode {filemode(mode)})"
    )


def _special(label: str, path: str, mode: int, *, is_root: bool = False) -> DataPathError:
    if is_root:
        return DataPathError(
            f"Data path {label!r} is {_kind(mode)}: only files and directories can be Data"
        )
    return DataPathError(
        f"Data path {label!r} contains {path!r}, which is {_kind(mode)}: "
        "only regular files and directories can be hashed and uploaded"
    )


def _unreadable(label: str, path: str, exc: OSError) -> DataReadError:
    return DataReadError(
        exc.errno, f"Data path {label!r}: cannot read {path!r}: {exc.strerror or exc}"
    )
