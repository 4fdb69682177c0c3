"""The Data scheme registry: which :class:`DataScheme` owns a ``Data`` path or ref URI.

A path with ``scheme://`` belongs to the scheme registered under that name; a path
without one is local.  Adding a scheme (``s3://``, say) is one module with a
``DataScheme`` subclass plus one :func:`register_scheme` call below.
"""

from __future__ import annotations

from airflow_provider_kinetic.core.data.schemes.base import DataScheme
from airflow_provider_kinetic.core.data.schemes.gcs import GcsScheme
from airflow_provider_kinetic.core.data.schemes.hf import HfScheme
from airflow_provider_kinetic.core.data.schemes.kinetic import KineticKeyScheme
from airflow_provider_kinetic.core.data.schemes.local import FileUriScheme, LocalPathScheme

__all__ = ["DataScheme", "register_scheme", "scheme_for", "scheme_names"]

_SCHEMES: dict[str, DataScheme] = {}


def register_scheme(scheme: DataScheme) -> None:
    """Make ``scheme`` own paths starting with ``{scheme.name}://``."""
    _SCHEMES[scheme.name] = scheme


def scheme_names() -> tuple[str, ...]:
    """Registered URI schemes (local paths need none)."""
    return tuple(n for n in _SCHEMES if n != LocalPathScheme.name)


def scheme_for(path: str) -> DataScheme:
    """The scheme that owns ``path`` (a Data path or a ref URI)."""
    name, sep, _ = path.partition("://")
    if not sep:
        return _SCHEMES[LocalPathScheme.name]
    try:
        return _SCHEMES[name]
    except KeyError:
        allowed = ", ".join(f"{n}://" for n in scheme_names())
        raise ValueError(
            f"Data path {path!r}: unsupported scheme {name + '://'!r}; "
            f"use a local path or one of {allowed}"
        ) from None


register_scheme(LocalPathScheme())
register_scheme(FileUriScheme())
register_scheme(GcsScheme())
register_scheme(HfScheme())
register_scheme(KineticKeyScheme())
