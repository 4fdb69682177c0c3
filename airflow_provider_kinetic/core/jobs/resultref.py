"""Results that do not fit XCom stay in the store; XCom carries a small reference.

A reference is ``{"kinetic_result": uri, "type": ..., "bytes": n, "sha256": digest}``
of the job's ``result.pkl``; with ``"key": k`` it stands for ``result[k]`` only (one
large value of a ``multiple_outputs`` dict, each key travelling on its own).  The
worker creates it only after verifying the result's signature, and XCom (Airflow's
database) is trusted, so whoever loads a reference checks the blob against ``sha256``
and needs no key: a Kinetic task's runner (when the reference is passed in its
arguments) or ``load_result`` in a plain Python task.
The job is never re-run to deliver its value.
"""

from __future__ import annotations

import hashlib
from typing import Any

import cloudpickle

from airflow_provider_kinetic.core.data import KEEP, map_leaves
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import store_for_uri

REF_KEY = "kinetic_result"


class ResultRefError(KineticError, ValueError):
    """A result reference that cannot be loaded (missing, altered, or not a success)."""


def make_result_ref(uri: str, value: Any, blob: bytes, key: str | None = None) -> dict[str, Any]:
    """A reference to ``value``: the whole result in ``blob``, or its item ``key``."""
    kind = type(value)
    ref = {
        REF_KEY: uri,
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    if key is not None:
        ref["key"] = key
    return ref


def is_result_ref(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get(REF_KEY), str)
        and isinstance(obj.get("sha256"), str)
    )


def result_ref_uris(delivered: Any) -> set[str]:
    """URIs of the results that references in ``delivered`` (a task's value as XCom
    holds it) point at: cleanup keeps those jobs' artifacts (their value lives only
    there)."""
    return {ref[REF_KEY] for ref in _refs(delivered)}


def _refs(value: Any) -> list[dict[str, Any]]:
    if is_result_ref(value):
        return [value]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    if isinstance(value, dict):  # multiple_outputs: references key by key
        return [r for v in value.values() for r in _refs(v)]
    return []


def load_result(ref: dict[str, Any]) -> Any:
    """The object a reference stands for (from a plain Python task, or the runner)."""
    return _select(ref, _load_whole(ref))


def _select(ref: dict[str, Any], result: Any) -> Any:
    return result[ref["key"]] if "key" in ref else result


def _load_whole(ref: dict[str, Any]) -> Any:
    if not is_result_ref(ref):
        raise ResultRefError(f"not a kinetic result reference: {ref!r:.200}")
    store, key = store_for_uri(ref[REF_KEY])
    blob = store.read_bytes(key)
    digest = hashlib.sha256(blob).hexdigest()
    if digest != ref["sha256"]:
        raise ResultRefError(
            f"{ref[REF_KEY]} changed since its reference was made "
            f"(sha256 {digest}, expected {ref['sha256']}): refusing to unpickle it"
        )
    payload = cloudpickle.loads(blob)
    if not isinstance(payload, dict) or not payload.get("success"):
        raise ResultRefError(f"{ref[REF_KEY]} does not hold a successful result")
    return payload.get("result")


def resolve_result_refs(obj: Any, cache: dict[str, Any] | None = None) -> Any:
    """``obj`` with every reference replaced by its object (each URI loaded once)."""
    cache = {} if cache is None else cache

    def resolve(x: Any) -> Any:
        if not is_result_ref(x):
            return KEEP
        if x[REF_KEY] not in cache:
            cache[x[REF_KEY]] = _load_whole(x)
        return _select(x, cache[x[REF_KEY]])

    return map_leaves(obj, resolve)
