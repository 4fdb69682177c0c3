"""``BroadcastWindow``: how a batch's peers share one key or Data instead of each
reading the store.

Why a value object of its own: the same window is given to ``store.get`` inside a
job, to ``store.put``/``get`` of tensors, and built by ``KineticMapOperator(...,
broadcast=True)`` for its children; it is checked once, where it is made, so a bad
window fails before anything moves (the developer guide's "bad input fails early").

Fields (Kubetorch's names where they mean the same, see ``docs/KEYS.md``):

- ``fanout``: how many children one peer serves at most (a tree; 50 reaches 2,500
  peers in two hops, the figure Kubetorch documents for its tree);
- ``timeout``: seconds (or "30s", "5m") a getter waits for a parent before it reads
  the store itself; also the longest a parent may stall before a child re-parents;
- ``world_size``: the number of peers in a quorum (tensors: ``torch.distributed``
  needs every rank); None for a rolling file broadcast (peers join as they come);
- ``group_id``: names the broadcast when one batch runs several (default: the key
  and its version, so every peer getting the same bytes meets in one tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.durations import duration_s
from airflow_provider_kinetic.core.errors import KineticError

DEFAULT_FANOUT = 50
DEFAULT_TIMEOUT_S = 600.0


class BroadcastWindowError(KineticError, ValueError):
    """A window field outside its allowed range (raised where the window is made)."""


@dataclass(frozen=True)
class BroadcastWindow:
    """A tree broadcast's shape among a batch's (or an LWS job's) peers."""

    fanout: int = DEFAULT_FANOUT
    timeout: float | str = DEFAULT_TIMEOUT_S
    world_size: int | None = None
    group_id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fanout, bool) or not isinstance(self.fanout, int) or self.fanout < 1:
            raise BroadcastWindowError(
                f"BroadcastWindow fanout={self.fanout!r}: must be an integer >= 1 "
                "(how many peers one peer serves)"
            )
        if self.world_size is not None and (
            isinstance(self.world_size, bool)
            or not isinstance(self.world_size, int)
            or self.world_size < 1
        ):
            raise BroadcastWindowError(
                f"BroadcastWindow world_size={self.world_size!r}: must be an integer >= 1 "
                "(the number of peers in the quorum) or None"
            )
        seconds = (
            float(self.timeout)
            if isinstance(self.timeout, (int, float)) and not isinstance(self.timeout, bool)
            else duration_s(self.timeout, lenient=True)
        )
        if seconds is None or seconds <= 0:
            raise BroadcastWindowError(
                f"BroadcastWindow timeout={self.timeout!r}: must be seconds > 0 "
                "(a number, or a duration like '30s', '5m')"
            )
        object.__setattr__(self, "timeout", seconds)
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise BroadcastWindowError(
                f"BroadcastWindow group_id={self.group_id!r}: must be a non-empty string or None"
            )

    @property
    def timeout_s(self) -> float:
        """The timeout in seconds (normalised when the window was made)."""
        return float(self.timeout)

    def to_dict(self) -> dict[str, Any]:
        """The wire form (a job's environment, a trigger's kwargs): JSON-safe."""
        return {
            "fanout": self.fanout,
            "timeout": self.timeout_s,
            "world_size": self.world_size,
            "group_id": self.group_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BroadcastWindow:
        return cls(
            **{k: data[k] for k in ("fanout", "timeout", "world_size", "group_id") if k in data}
        )
