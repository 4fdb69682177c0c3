"""Batches: one function over many inputs, with a concurrency cap, retries, fail-fast.

The whole batch is described by a :class:`BatchState` (JSON on the wire) so that the
operator can carry it across deferrals (``KineticBatchTrigger`` echoes it in its
event) and any process can continue it.  Every child is the batch's one
:class:`JobTemplate` plus its input index.  The
function, shared arguments and every ``Data`` are uploaded once; each child writes
only its ``handle.json`` (kinetic's attach needs it).  The group manifest
``_groups/{group_id}/manifest.json`` follows kinetic's format and is rewritten at
most every ``MANIFEST_INTERVAL_S`` (and when submission completes), not per child.
"""

from __future__ import annotations

import hashlib
import keyword
import logging
from collections.abc import Sequence
from typing import Any

from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import cache_hash
from airflow_provider_kinetic.core.jobs import batchwire
from airflow_provider_kinetic.core.jobs.history import DATA_HASHES
from airflow_provider_kinetic.core.jobs.pack import prepare, ref_for_data, reuse_call
from airflow_provider_kinetic.core.jobs.payload import (
    UnpicklableArgumentError,
    find_data,
    replace_data,
)
from airflow_provider_kinetic.core.jobs.request import (
    JobRequest,
    capture_env,
    plan_for_request,
    validate_data,
)
from airflow_provider_kinetic.core.jobs.submit import (
    cache_key_for,
    checkpoint_slots,
    template_for,
    use_default_capacity,
)
from airflow_provider_kinetic.core.jobs.work import template_options, unsure, work_digest
from airflow_provider_kinetic.core.spec.handles import new_group_id, utc_now_iso
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)

INPUT_MODES = ("auto", "single", "args", "kwargs")
#: ``BatchState.extra``: input index (a string) -> its reuse key (``cache=True``).
CACHE_KEYS = "cache_keys"
PAYLOAD_CACHE = "default/payload-cache"


def split_input(item: Any, mode: str, index: int) -> tuple[tuple, dict]:
    """(args, kwargs) of one input under kinetic's input modes."""
    if mode == "single":
        return (item,), {}
    if mode == "args":
        if not isinstance(item, list | tuple):
            raise TypeError(
                f"input_mode='args' needs a list or tuple per input; inputs[{index}] is "
                f"{type(item).__name__}: {item!r}"
            )
        return tuple(item), {}
    if mode == "kwargs":
        if not isinstance(item, dict):
            raise TypeError(
                f"input_mode='kwargs' needs a dict per input; inputs[{index}] is "
                f"{type(item).__name__}: {item!r}"
            )
        return (), dict(item)
    if (
        isinstance(item, dict)
        and item
        and all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in item)
    ):
        return (), dict(item)
    if isinstance(item, list | tuple):
        return tuple(item), {}
    return (item,), {}


def validate_options(inputs: Any, input_mode: str, max_concurrent: Any, retries: Any) -> list[Any]:
    """Raise a clear error for bad batch options; returns the inputs as a list."""
    if isinstance(inputs, str | bytes | dict) or not isinstance(inputs, Sequence):
        raise TypeError(f"inputs must be a list or tuple of inputs, got {type(inputs).__name__}")
    if not inputs:
        raise ValueError("inputs is empty: a batch needs at least one input")
    if input_mode not in INPUT_MODES:
        raise ValueError(f"input_mode {input_mode!r} is not one of {', '.join(INPUT_MODES)}")
    if (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise ValueError(f"max_concurrent must be an integer >= 1, got {max_concurrent!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    return list(inputs)


def plan_batch(
    request: JobRequest,
    inputs: Sequence[Any],
    input_mode: str,
    store: ObjectStore,
    *,
    config: KineticConfig,
    max_concurrent: int,
    retries: int,
    fail_fast: bool,
    group_name: str | None = None,
    tags: list[str] | None = None,
    signing_secret: bytes | None = None,
) -> tuple[BatchState, dict[str, bytes], list[Data]]:
    """Validate and pack a batch; uploads nothing.

    Returns the state, the objects to write (key -> bytes) and the local Data to
    upload.  ``request`` carries the function, shared kwargs, volumes, accelerator
    and every other option, exactly as for a single job.
    """
    items = validate_options(inputs, input_mode, max_concurrent, retries)
    split = [split_input(item, input_mode, i) for i, item in enumerate(items)]
    kind = config.backend_kind(request.options.accelerator)
    use_default_capacity(request, config)
    found = [(d, w) for i, (a, k) in enumerate(split) for d, w in find_data((a, k), f"inputs[{i}]")]
    validate_data(found)
    captured = capture_env(request.capture_env_vars)
    # Signed batches carry captured values encrypted (job secrets), never in the payload.
    env = {} if signing_secret is not None else dict(captured)
    refs = {id(d): _input_ref(d, store) for d, _ in found}
    child_inputs = [(replace_data(a, refs), replace_data(k, refs)) for a, k in split]
    try:
        inputs_blob = batchwire.pack_inputs(child_inputs)
    except Exception as exc:
        raise UnpicklableArgumentError(_bad_input(child_inputs, exc)) from exc
    group_id = new_group_id()
    inputs_key = f"_groups/{group_id}/inputs.pkl"
    batch_inputs = {"uri": store.uri(inputs_key), "sha256": hashlib.sha256(inputs_blob).hexdigest()}
    image = plan_for_request(request, config, kind)  # bad image/requirements: raise here
    requirements_key = f"{PAYLOAD_CACHE}/{image.requirements.sha256}.requirements.txt"
    # The shared part: function, op_kwargs, volumes (validated and packed once).
    packed = prepare(request, store, env, batch_inputs=batch_inputs, input_refs=bool(found))
    payload_sha = hashlib.sha256(packed.payload).hexdigest()
    template = template_for(
        request,
        packed,
        kind,
        payload_uri=store.uri(f"{PAYLOAD_CACHE}/{payload_sha}.pkl"),
        context_uri=store.uri(packed.context_key),  # shared with every job of this content
        output_dir=request.output_dir or store.uri(f"outputs/{group_id}"),
        captured=captured,
        group_id=group_id,
        signing_secret=signing_secret,
        image=image,
        requirements_uri=store.uri(requirements_key),
    )
    work = None
    if packed.call_sha256 is not None:
        options = template_options(template, request.capture_env_vars)
        try:
            work = work_digest(
                call=packed.call_sha256,
                options=options,
                inputs=child_inputs,
                func=request.func,
                by_value_roots=request.by_value_roots,
            )
        except Exception as exc:  # noqa: BLE001 - an odd input: other work than any other
            log.warning(
                "cannot fingerprint the batch inputs (%s); it counts as new work: a later "
                "try will not resume this batch",
                exc,
            )
            work = unsure(type(exc).__name__)
    checkpoint_slots(template, work)
    state = BatchState(
        group_id=group_id,
        group_name=group_name or request.func_name,
        template=template,
        total=len(items),
        max_concurrent=max_concurrent,
        retries=retries,
        fail_fast=fail_fast,
        created_at=utc_now_iso(),
        tags=list(tags or []),
        queue=list(range(len(items))),
        work=work,
    )
    # What the batch reads (shared Data, every input's Data and ``kinetic://`` keys):
    # its history entry names them from its start, so ``data gc`` keeps them while a
    # child may still read them, as a single job's handle does (``core.jobs.holds``).
    held = list(packed.data_hashes)
    held += [h for ref in refs.values() if (h := cache_hash(str(ref.get("uri", "")))) is not None]
    if held:
        state.extra[DATA_HASHES] = list(dict.fromkeys(held))
    if request.cache is not None:  # cache=True: each input's reuse key, by index
        keys = {
            str(i): cache_key_for(request, template, reuse_call(request, packed, a, k))
            for i, (a, k) in enumerate(child_inputs)
        }
        state.extra[CACHE_KEYS] = {i: key for i, key in keys.items() if key is not None}
    objects = {
        f"{PAYLOAD_CACHE}/{payload_sha}.pkl": packed.payload,
        packed.context_key: packed.context,
        inputs_key: inputs_blob,
    }
    if template.requirements_uri:  # prebuilt: installed at every child's start
        objects[requirements_key] = image.requirements.text.encode()
    local = packed.local_data + [d for d, _ in found if d.uploads]
    return state, objects, local


def _input_ref(data: Data, store: ObjectStore) -> dict[str, Any]:
    if data.fuse:
        raise ValueError(
            f"{data!r}: fuse=True is not supported inside batch inputs; "
            "pass it in op_kwargs or volumes"
        )
    return ref_for_data(data, store, None)[0]


def _bad_input(inputs: list[tuple[tuple, dict]], exc: Exception) -> str:
    """Name the first input cloudpickle cannot serialise."""
    import cloudpickle

    for i, item in enumerate(inputs):
        try:
            cloudpickle.dumps(item)
        except Exception as inner:  # noqa: BLE001 - any failure names the culprit
            return f"inputs[{i}] cannot be pickled: {inner}"
    return f"the batch inputs cannot be pickled: {exc}"
