"""Packing one job: Data validated and resolved to refs, the payload pickled (and its
size capped), the job context zipped.  Nothing is uploaded here (dry runs stop after
packing).

The cap (``[kinetic] max_payload_mb``, default 64) exists because arguments travel
by value inside the payload, pickled, uploaded and held in memory on every submit and
by every runner; hundreds of MB of ``op_kwargs`` are a dataset that belongs in
``Data`` (hashed, uploaded once to the data cache, a path in the job).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator, parse_accelerator
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.mounts import FUSE_ROOT, FuseMount
from airflow_provider_kinetic.core.data.refs import cache_hash
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.jobs.byvalue import by_value
from airflow_provider_kinetic.core.jobs.payload import (
    build_context_zip,
    find_data,
    pack_payload,
    replace_data,
)
from airflow_provider_kinetic.core.jobs.request import JobRequest, validate_data, validate_volumes
from airflow_provider_kinetic.core.jobs.work import call_digest, named_call, unsure
from airflow_provider_kinetic.core.keys import resolve as _key_resolver  # noqa: F401 - installs kinetic://
from airflow_provider_kinetic.core.runtime import context as job_context
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)

#: The env var of the function's output dir (``core.jobs.submit.plan_job`` sets it).
OUTPUT_DIR_ENV = "KINETIC_OUTPUT_DIR"
#: Default of ``[kinetic] max_payload_mb`` (MiB).
DEFAULT_MAX_PAYLOAD_MB = 64.0


class PayloadTooLargeError(KineticError, ValueError):
    """The pickled call is over ``[kinetic] max_payload_mb``; names the largest arguments."""


@dataclass
class PackedJob:
    """A validated, packed job: nothing uploaded yet."""

    accelerator: Accelerator
    local_data: list[Data]
    payload: bytes
    context: bytes
    fuse: list[FuseMount]
    #: ``core.jobs.work.call_digest`` of the call (``unsure-...`` when it could not
    #: be computed: equal to no other try's, so never adopted).
    call_sha256: str | None = None
    #: Data-cache entries the job reads (local Data and ``kinetic://`` keys): its
    #: handle and history entry name them, so ``data gc`` keeps them meanwhile.
    data_hashes: list[str] = field(default_factory=list)
    #: With ``cache=True``: the call digest the reuse key starts from (the arguments by
    #: name, ``cache_ignore``'s left out; the task run's default output dir too).
    reuse_call: str | None = None
    #: With ``cache=True``: the shared kwargs (Data as refs), volume refs and env that
    #: ``reuse_call`` digests with each call's own arguments.
    reuse_parts: tuple[dict, list, dict] | None = None

    @property
    def context_sha256(self) -> str:
        return hashlib.sha256(self.context).hexdigest()

    @property
    def context_key(self) -> str:
        """The shared, content-addressed object every job with this context uses."""
        return job_context.context_key(self.context_sha256)


def ref_for_data(
    data: Data, store: ObjectStore, mount: str | None
) -> tuple[dict, FuseMount | None]:
    """The wire ref for ``data`` (hash computed, nothing uploaded) and its FUSE mount;
    what that means is the Data scheme's business."""
    return data.scheme.ref(data, store, mount)


def prepare(
    request: JobRequest,
    store: ObjectStore,
    env_vars: dict[str, str],
    batch_inputs: dict[str, str] | None = None,
    input_refs: bool = False,
) -> PackedJob:
    """Validate everything and pack the payload; uploads nothing.

    ``batch_inputs`` / ``input_refs``: a batch's shared payload (see ``core.batch.plan``).
    """
    accel = parse_accelerator(request.options.accelerator)
    volumes = validate_volumes(request.volumes)
    excludes = job_context.check_patterns(request.context_excludes)
    found = [(d, f"volumes[{p!r}]", p) for p, d in volumes.items()]
    found += [(d, w, None) for d, w in find_data(tuple(request.args), "op_args")]
    found += [(d, w, None) for d, w in find_data(dict(request.kwargs), "op_kwargs")]
    validate_data((d, w) for d, w, _ in found)
    refs: dict[int, dict] = {}
    volume_refs: list[dict] = []
    fuse: list[FuseMount] = []
    for data, _, volume in found:
        if volume is None and id(data) in refs:
            continue  # the same Data object twice: one ref, one download
        mount = volume
        if data.fuse and mount is None and store.scheme == "gs":
            mount = f"{FUSE_ROOT}/{len(fuse)}"
        ref, fuse_mount = ref_for_data(data, store, mount)
        if fuse_mount is not None:
            fuse.append(fuse_mount)
        if volume is not None:
            volume_refs.append(ref)
        else:
            refs[id(data)] = ref
    args = replace_data(tuple(request.args), refs)
    kwargs = replace_data(dict(request.kwargs), refs)
    # One by-value registration for the payload and the digests inside it: they see
    # the same code by value, and the loaded modules are scanned once.
    with by_value(request.func, list(request.by_value_roots or [])):
        payload = pack_payload(
            request.func,
            args,
            kwargs,
            env_vars=env_vars,
            volumes=volume_refs,
            has_data_refs=bool(refs) or input_refs,
            by_value_roots=request.by_value_roots,
            batch_inputs=batch_inputs,
        )
        check_payload_size(payload, args, kwargs, request.max_payload_mb)
        call = _call_digest(request, args, kwargs, volume_refs, env_vars)
    local = [d for d, _, _ in found if d.uploads]
    held = {cache_hash(r["uri"]) for r in [*refs.values(), *volume_refs]} - {None}
    context = build_context(request, excludes, local)
    held_hashes = sorted(h for h in held if h)
    packed = PackedJob(accel, local, payload, context, fuse, call, held_hashes)
    if request.cache is not None:
        if request.cache.default_output:  # the task run's own dir: not what is computed
            env_vars = {k: v for k, v in env_vars.items() if k != OUTPUT_DIR_ENV}
        packed.reuse_parts = (kwargs, volume_refs, env_vars)
        packed.reuse_call = reuse_call(request, packed, args, {})
    return packed


def reuse_call(request: JobRequest, packed: PackedJob, args: tuple, kwargs: dict) -> str | None:
    """``call_digest`` of one call as the reuse key sees it (``core.jobs.resultcache``):
    the shared ``op_kwargs`` with ``args`` / ``kwargs`` (a batch input's) by argument
    name, less ``cache_ignore``; the default output dir left out (``prepare``)."""
    if request.cache is None or packed.reuse_parts is None:
        return None
    shared, volumes, env = packed.reuse_parts
    try:
        named = named_call(request.func, args, {**shared, **kwargs}, request.cache.ignore)
        return call_digest(request.func, (), named, volumes, env, request.by_value_roots)
    except Exception as exc:  # noqa: BLE001 - not comparable: never reused
        log.warning("cache: cannot fingerprint this call (%s); its result is not reused", exc)
        return unsure(type(exc).__name__)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def check_payload_size(payload: bytes, args: tuple, kwargs: dict, max_mb: float | None) -> None:
    """Fail (before anything is uploaded) when the pickled call is over ``max_mb`` MiB
    (None: ``DEFAULT_MAX_PAYLOAD_MB``; 0: no cap), naming the largest arguments and
    pointing to ``Data``.  Each argument is pickled again only on that failure."""
    cap = DEFAULT_MAX_PAYLOAD_MB if max_mb is None else float(max_mb)
    if cap <= 0 or len(payload) <= cap * 2**20:
        return
    sizes: list[tuple[int, str]] = []
    named: dict[str, Any] = {f"op_args[{i}]": a for i, a in enumerate(args)}
    named.update({f"op_kwargs[{k!r}]": v for k, v in kwargs.items()})
    for where, value in named.items():
        try:
            sizes.append((len(cloudpickle.dumps(value)), where))
        except Exception:  # noqa: BLE001 - it was pickled in the payload; size unknown here
            continue
    ranked = sorted(sizes, key=lambda s: (-s[0], s[1]))
    largest = [s for s in ranked[:3] if s[0] >= 2**16] or ranked[:1]  # none of the tiny
    parts = [f"{where} {_mib(size)}" for size, where in largest]
    rest = len(payload) - sum(size for size, _ in sizes)
    if rest > cap * 2**20 / 2 or not parts:  # much of it is the function and its code
        parts.append(f"the function and its by-value code {_mib(rest)}")
    raise PayloadTooLargeError(
        f"the job's pickled call (function, op_args, op_kwargs) is {_mib(len(payload))}, "
        f"over the {cap:g} MiB cap ([kinetic] max_payload_mb = {cap:g}). Largest: "
        f"{'; '.join(parts)}. Arguments travel inside the "
        "payload on every submit: pass large data as Data(path) instead (hashed and "
        "uploaded once to the data cache, a local path in the job), or raise the cap "
        "(AIRFLOW__KINETIC__MAX_PAYLOAD_MB; 0 disables it). Nothing was uploaded."
    )


def _call_digest(
    request: JobRequest, args: tuple, kwargs: dict, volumes: list[dict], env: dict[str, str]
) -> str:
    try:
        return call_digest(request.func, args, kwargs, volumes, env, request.by_value_roots)
    except Exception as exc:  # noqa: BLE001 - an odd value: other work than any other try's
        log.warning(
            "cannot fingerprint this call (%s); it counts as new work: a later try "
            "will not adopt its job",
            exc,
        )
        return unsure(f"{type(exc).__name__}")


def build_context(request: JobRequest, excludes: list[str], local: list[Data]) -> bytes:
    """The DAG's project directory as the job context (local Data inside it is left out:
    it travels through the data cache); a plan-only context without a DAG file."""
    if request.entry_file is None:
        return build_context_zip()
    built = job_context.build_context(
        request.entry_file,
        excludes=excludes,
        max_mb=request.max_context_mb,
        skip=[d.local_path for d in local],
        ceilings=request.by_value_roots,  # the DAGs folder: never climb out of it
    )
    return built.data
