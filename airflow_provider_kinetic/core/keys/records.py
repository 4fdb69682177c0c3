"""A key's state as stored: its version history, newest first, in ONE object.

Keeping the whole history in the pointer object means one compare-and-swap moves
the current version *and* trims the history together: no reader can see a pointer
whose version record is missing.  A version is the content hash of the tree (as
``Data`` hashes it), so the same bytes put twice are one version (moved to the top).
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

#: ``[kinetic] store_keep_versions`` default.
DEFAULT_KEEP = 10
FORMAT = 1


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def user_at_host() -> dict[str, str]:
    """Who put it, outside Airflow tasks and jobs (a laptop, the CLI)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return {"user": user, "host": socket.gethostname()}


#: The ``by`` field of a version put by a task of a dated DAG run (``output_key``).
LOGICAL_DATE = "logical_date"


def parse_logical_date(value: Any) -> datetime | None:
    """An ISO 8601 logical date as an aware datetime (naive: UTC); None if absent or
    not a date (a record written by hand must not break a publish)."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def older_than_current(state: KeyState | None, v: Version) -> bool:
    """Whether ``v`` belongs to an earlier logical date than the key's current
    version (both known): moving the key to it would move it backwards."""
    if state is None or not state.versions:
        return False
    mine, current = v.logical_date, state.current.logical_date
    return mine is not None and current is not None and mine < current


@dataclass
class Version:
    """One put: the content hash and what it covered, when, by whom."""

    version: str
    epoch: float
    size: int
    files: int
    #: "dir" or "file" (a file key's content is one file named ``name``).
    kind: str
    name: str = ""
    empty_dirs: list[str] = field(default_factory=list)
    by: dict[str, Any] = field(default_factory=dict)
    #: Unique per put call: a retried swap whose first try landed knows its own write.
    put_id: str = ""

    @property
    def time(self) -> str:
        return iso(self.epoch)

    @property
    def logical_date(self) -> datetime | None:
        """The logical date of the DAG run whose task put it (``by["logical_date"]``,
        ISO 8601: a field of ``by`` so records stay readable by every version); None
        for a put outside a dated run."""
        return parse_logical_date(self.by.get(LOGICAL_DATE))

    def row(self, key: str) -> dict[str, Any]:
        """The public form (``ls``, ``put``'s answer, the CLI's JSON)."""
        return {
            "key": key,
            "version": self.version,
            "time": self.time,
            "size": self.size,
            "files": self.files,
            "kind": self.kind,
            "by": dict(self.by),
        }


@dataclass
class KeyState:
    key: str
    versions: list[Version] = field(default_factory=list)
    keep: int = DEFAULT_KEEP
    ttl_s: float | None = None
    #: When a publish of content the key already held last renewed it (``output_key``
    #: of unchanged output makes no new version, ``KeyStore.renew``): expiry counts
    #: from it too.  Written only once set.
    renewed: float | None = None

    @property
    def current(self) -> Version:
        return self.versions[0]

    @property
    def expires_at(self) -> float | None:
        """Expiry counts from the latest put or renewal (a key in use stays alive)."""
        if self.ttl_s is None or not self.versions:
            return None
        return max(self.current.epoch, self.renewed or 0.0) + self.ttl_s

    def expired(self, now: float | None = None) -> bool:
        at = self.expires_at
        return at is not None and (time.time() if now is None else now) >= at

    def pushed(self, v: Version, held: frozenset[str] = frozenset()) -> KeyState:
        """This state with ``v`` on top (an older entry of the same hash dropped) and
        the history cut to ``keep``, except versions in ``held`` (a pin names them)."""
        rest = [old for old in self.versions if old.version != v.version]
        return KeyState(self.key, cut([v, *rest], self.keep, held), self.keep, self.ttl_s)

    def kept_aside(self, v: Version, held: frozenset[str] = frozenset()) -> KeyState:
        """This state with ``v`` kept (listed, resolvable by its hash) right after the
        current version, which stays current; the history cut to ``keep`` (at least
        2, so the version kept aside is kept), except versions in ``held``."""
        rest = [old for old in self.versions[1:] if old.version != v.version]
        versions = cut([self.current, v, *rest], max(2, self.keep), held)
        return KeyState(self.key, versions, self.keep, self.ttl_s, self.renewed)

    def find(self, version: str) -> list[Version]:
        """Kept versions whose hash starts with ``version``."""
        return [v for v in self.versions if v.version.startswith(version)]

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "key": self.key,
            "keep": self.keep,
            "ttl_s": self.ttl_s,
            "versions": [asdict(v) for v in self.versions],
        }
        if self.renewed is not None:
            body["renewed"] = self.renewed
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyState:
        body = json.loads(data)
        return cls(
            key=body["key"],
            versions=[Version(**v) for v in body.get("versions", [])],
            keep=int(body.get("keep") or DEFAULT_KEEP),
            ttl_s=body.get("ttl_s"),
            renewed=body.get("renewed"),
        )


def cut(versions: list[Version], keep: int, held: frozenset[str] = frozenset()) -> list[Version]:
    """The newest ``keep`` of ``versions`` (newest first) and any older one in ``held``:
    a version a pin names outlives ``store_keep_versions`` while its pin lives."""
    keep = max(1, keep)
    return versions[:keep] + [v for v in versions[keep:] if v.version in held]
