"""What XCom holds of a job's value: the value itself where Airflow can store it,
else a reference to the job's verified ``result.pkl`` (``core.jobs.resultref``).

A value over ``[kinetic] max_xcom_result_bytes`` becomes a reference with Airflow's own
database backend.  A deployment whose ``[core] xcom_backend`` stores large values
itself (the common.io object-storage backend, or any backend class that declares
``offloads_large_values = True``) gets the value itself, whatever its size: a plain
``@task`` downstream receives it without ``load_result``.  Whether Airflow can store a
value is checked with Airflow's own serializer, never the deployment backend's (which
would upload it once more to check it).
"""

from __future__ import annotations

import json
from typing import Any

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.core.jobs.resultref import REF_KEY, make_result_ref
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.storage import ObjectStore

#: Default of ``[kinetic] max_xcom_result_bytes``: larger results travel by reference.
MAX_XCOM_RESULT_BYTES = 1024 * 1024


def _base_xcom() -> Any:
    """Airflow's own XCom class (its serializer, with no side effect)."""
    from airflow.sdk.bases.xcom import BaseXCom

    return BaseXCom


def offloaded() -> bool:
    """Whether the deployment's XCom backend stores large values itself (see the module)."""
    path = conf.get("core", "xcom_backend", fallback="") or ""
    if not path or path.rsplit(".", 1)[-1] == "BaseXCom":
        return False
    try:
        backend = conf.getimport("core", "xcom_backend")
    except Exception:  # noqa: BLE001 - a backend that cannot load: Airflow says so itself
        return False
    if getattr(backend, "offloads_large_values", False):
        return True
    try:
        from airflow.providers.common.io.xcom.backend import XComObjectStorageBackend
    except ImportError:
        return False
    return isinstance(backend, type) and issubclass(backend, XComObjectStorageBackend)


def unstorable(value: Any, limit: int) -> str | None:
    """Why Airflow cannot store ``value`` as an XCom (None: it can).

    Checked with Airflow's own serializer and the strict JSON its API sends (a NaN or
    an infinity passes ``json.dumps`` but not the API), before the job's artifacts are
    deleted or its record says "delivered"."""
    try:
        text = json.dumps(_base_xcom().serialize_value(value), allow_nan=False)
    except Exception as exc:  # noqa: BLE001 - whatever Airflow cannot serialise
        return f"Airflow cannot store a {type(value).__name__} as an XCom ({exc})"
    size = len(text.encode())
    if size > limit and not offloaded():
        return f"{size} bytes is more than [kinetic] max_xcom_result_bytes = {limit}"
    return None


def xcom_value(
    value: Any,
    store: ObjectStore,
    job_id: str,
    blob: bytes,
    log: Any,
    multiple_outputs: bool = False,
) -> Any:
    """``value`` when Airflow can store it in XCom within the limit, else a reference.

    The reference (``core.jobs.resultref``) points at the job's verified ``result.pkl``
    (``blob`` is its bytes), so the task succeeds and nothing is re-run to deliver it.
    With ``multiple_outputs`` (a dict whose keys become XComs) each key is judged on
    its own: only the values that do not fit become references, key by key.
    """
    limit = conf.getint("kinetic", "max_xcom_result_bytes", fallback=MAX_XCOM_RESULT_BYTES)
    uri = store.uri(artifact_key(job_id, "result.pkl"))
    if multiple_outputs and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        out = {}
        for key, item in value.items():
            why = unstorable(item, limit)
            out[key] = item if why is None else _ref(uri, item, blob, job_id, why, log, key)
        return out
    why = unstorable(value, limit)
    return value if why is None else _ref(uri, value, blob, job_id, why, log)


def _ref(
    uri: str, value: Any, blob: bytes, job_id: str, why: str, log: Any, key: str | None = None
) -> dict[str, Any]:
    ref = make_result_ref(uri, value, blob, key)
    what = f"the result of kinetic job {job_id}" + (f" (key {key!r})" if key is not None else "")
    log.warning(
        "%s does not fit XCom: %s. XCom holds a reference to %s (%d bytes); pass it to "
        "another Kinetic task, or load it with airflow_provider_kinetic.load_result(ref)",
        what,
        why,
        ref[REF_KEY],
        ref["bytes"],
    )
    return ref
