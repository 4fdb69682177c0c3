"""The errors a Data path's hash raises, and their messages (stdlib only).

Both the walk (``treewalk.py``) and the file reads (``filedigest.py``) raise them, so
they live below both.  Each message names the Data path as the user wrote it, the
entry at fault and what is allowed.  ``treewalk`` re-exports them (and ``core.data``).

The symlink rule: inside a Data tree a symlink must lead to a regular file (its
content counts, under the link's name, as in kinetic).  A link to a directory is
refused rather than followed, because kinetic 0.0.4's walk does not descend into it
(following it would change the shared content hash) and skipping it would hand the
job less than the user pointed at; a dangling link is refused for the same reason.
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


#: What a symlink inside a Data tree may be, for the messages.
_LINK_RULE = (
    "inside a Data tree a symlink must point to a regular file (followed); a symlink "
    "to a directory and a dangling symlink are refused: replace the link with the "
    "directory (or a copy of it), or remove it"
)


def _linked_dir(label: str, path: str) -> DataPathError:
    return DataPathError(
        f"Data path {label!r} contains {path!r}, which is a symlink to a directory: " + _LINK_RULE
    )


def _dangling(label: str, path: str, exc: OSError) -> DataPathError:
    return DataPathError(
        f"Data path {label!r} contains {path!r}, which is a dangling symlink "
        f"({exc.strerror or exc}): " + _LINK_RULE
    )


def _unreadable(label: str, path: str, exc: OSError) -> DataReadError:
    return DataReadError(
        exc.errno, f"Data path {label!r}: cannot read {path!r}: {exc.strerror or exc}"
    )
