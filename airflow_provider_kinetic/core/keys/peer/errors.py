"""What a getter learns when a source fails it: the ``PeerUnavailable`` family.

Every one of them means "try the next source" (the next parent up the chain, then
the store); the kind says why, for the caller's retry (``PeerNotServing``,
``PeerBusy``: ask again soon), its log line, or its refusal to go on
(``PeerForbidden``; ``PeerLied``: what came from peers is dropped).
"""

from __future__ import annotations

from airflow_provider_kinetic.core.errors import KineticError


class PeerUnavailable(KineticError, ConnectionError):
    """A peer could not be reached, refused us, or stalled: try another source."""


class PeerNotServing(PeerUnavailable):
    """The peer answered, but does not serve that content (yet): 404."""


class PeerForbidden(PeerUnavailable):
    """The peer answered 403: our token is not its scope's."""


class PeerBusy(PeerUnavailable):
    """The peer is at its connection cap (503 ``X-Kinetic-Busy``): ask again soon."""


class PeerLied(PeerUnavailable):
    """The peer sent what cannot be the content: a list that is not the version's, a
    body longer or shorter than its file, bytes that do not hash to the version.
    Nothing more is read from it; the message names the peer and what was wrong."""
