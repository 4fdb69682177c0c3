"""Wire form of batch children, shared by the client and the runner (Airflow-free).

A batch uploads ONE payload (the function and shared arguments) and ONE inputs
blob (every child's own arguments); a child is told its position by the env var
``KINETIC_GROUP_INDEX``.  So an N-input batch writes the function once, not N times.

The payload keeps kinetic's shape, but its ``func`` is a guard that fails loudly:
a runner that does not know ``batch_inputs`` (kinetic's own) must not silently call
the function without its input.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import cloudpickle

GROUP_INDEX_ENV = "KINETIC_GROUP_INDEX"
#: The batch id a child belongs to (its peers meet in ``KINETIC_PEER_SCOPE``, the same id).
GROUP_ID_ENV = "KINETIC_GROUP_ID"


def batch_guard(*_args: Any, **_kwargs: Any) -> None:
    """Stands in for ``func`` in batch payloads; only our runner unwraps them."""
    raise RuntimeError(
        "this is a KineticMapOperator batch child: its payload needs the "
        "airflow-provider-kinetic runner (python -m airflow_provider_kinetic.runner), "
        "which reads 'batch_inputs' and KINETIC_GROUP_INDEX"
    )


def pack_inputs(inputs: list[tuple[tuple, dict]]) -> bytes:
    """All children's (args, kwargs), Data already replaced by refs."""
    return cloudpickle.dumps([(tuple(a), dict(k)) for a, k in inputs])


def select_input(payload: dict[str, Any], read: Any) -> tuple[Any, tuple, dict]:
    """The (function, args, kwargs) of this child; ``read(uri) -> bytes``."""
    spec = payload["batch_inputs"]
    raw = os.environ.get(GROUP_INDEX_ENV, "")
    if not raw.isdigit():
        raise ValueError(f"{GROUP_INDEX_ENV} must be a non-negative integer, got {raw!r}")
    blob = read(spec["uri"])
    digest = hashlib.sha256(blob).hexdigest()
    if digest != spec["sha256"]:
        raise ValueError(f"batch inputs SHA-256 mismatch: expected {spec['sha256']}, got {digest}")
    inputs = cloudpickle.loads(blob)
    index = int(raw)
    if index >= len(inputs):
        raise IndexError(f"{GROUP_INDEX_ENV}={index} but the batch has {len(inputs)} inputs")
    args, kwargs = inputs[index]
    return payload["batch_func"], tuple(args), {**payload.get("kwargs", {}), **kwargs}
