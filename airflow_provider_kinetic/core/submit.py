"""Submission: validate, hash, pack, upload, create — in that order.

Every check that can fail on bad input runs before the first byte is uploaded.
If the backend cannot create the job, the job's artifacts are deleted again, so
nothing is left behind that looks like a job.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core import datacache
from airflow_provider_kinetic.core.accelerators import Accelerator, parse_accelerator, with_spot
from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.handles import JobHandle, artifact_key, new_job_id
from airflow_provider_kinetic.core.jobspec import FUSE_ROOT, FuseMount, JobSpec
from airflow_provider_kinetic.core.mounts import check_mount_paths
from airflow_provider_kinetic.core.payload import (
    build_context_zip,
    find_data,
    pack_payload,
    replace_data,
)
from airflow_provider_kinetic.core.runtime import context as job_context
from airflow_provider_kinetic.core.runtime.images import ImagePlan, plan_for_request
from airflow_provider_kinetic.core.signing import AUTH_HMAC, AUTH_NONE, encrypt_env
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.template import JobTemplate, function_output_dir

log = logging.getLogger(__name__)

ENV_BLOCKLIST = frozenset(
    {
        "PATH",
        "HOME",
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "SHELL",
        "TMPDIR",
        "TEMP",
        "TMP",
        "HOSTNAME",
        "USER",
        "LOGNAME",
        "SSH_AUTH_SOCK",
        "KUBERNETES_SERVICE_HOST",
        "KERAS_BACKEND",
    }
)


@dataclass
class JobRequest:
    """One call to run remotely, as the operator (or plain Python) describes it."""

    func: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    accelerator: str = "cpu"
    volumes: dict[str, Data] | None = None
    capture_env_vars: list[str] | None = None
    output_dir: str | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    by_value_roots: list[str] = field(default_factory=list)
    cpu_request: str | None = None
    memory_request: str | None = None
    job_id: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)
    #: Spot VMs; the same as a ``:spot`` suffix on ``accelerator`` (kinetic has both).
    spot: bool = False
    #: The DAG file: its project directory becomes the job context (``core.runtime.context``);
    #: None (plain Python without a DAG) sends a plan-only context.
    entry_file: str | None = None
    #: Extra glob patterns left out of the context (as lines of ``.kineticignore``).
    context_excludes: list[str] = field(default_factory=list)
    #: Size cap of the context in MB (``[kinetic] max_context_mb``); None: the default.
    max_context_mb: float | None = None
    #: ``bundled`` | ``prebuilt`` | an image URI; None: the connection's (core.runtime.images).
    container_image: str | None = None
    #: Requirement lines or a file path; None: discovered next to ``entry_file``.
    requirements: list[str] | str | None = None
    #: The image plan the operator already resolved (and built); None: resolved here.
    image_plan: ImagePlan | None = None

    @property
    def accelerator_spec(self) -> str:
        """``accelerator`` with ``:spot`` appended when ``spot`` asks for it."""
        return with_spot(self.accelerator, self.spot)

    @property
    def func_name(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)


def capture_env(
    patterns: list[str] | None, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """kinetic's capture rules: exact names, ``PREFIX*`` patterns, ``*`` for all.

    Wildcards skip the blocklist unless the name is also listed exactly.
    """
    environ = dict(os.environ if environ is None else environ)
    out: dict[str, str] = {}
    exact = {p for p in patterns or [] if not p.endswith("*")}
    for pattern in patterns or []:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"capture_env_vars entries must be non-empty strings, got {pattern!r}")
        if pattern in exact:
            if pattern in environ:
                out[pattern] = environ[pattern]
            continue
        for name, value in environ.items():
            if fnmatch.fnmatchcase(name, pattern) and (name not in ENV_BLOCKLIST or name in exact):
                out[name] = value
    return out


def validate_volumes(volumes: Any) -> dict[str, Data]:
    """Mount paths safe (``core.mounts``) and values Data; raises naming the bad entry."""
    if volumes is None:
        return {}
    if not isinstance(volumes, dict):
        raise TypeError(f"volumes must be a dict of absolute path -> Data, got {volumes!r}")
    check_mount_paths(volumes, FUSE_ROOT)
    for path, value in volumes.items():
        if not isinstance(value, Data):
            raise TypeError(f"volume {path!r} must be a Data(...), got {type(value).__name__}")
    return volumes


def validate_data(found: Iterable[tuple[Data, str]]) -> None:
    """Check every (Data, location) pair; the error names the location and the path."""
    for data, where in found:
        try:
            data.validate()
        except (FileNotFoundError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}") from None


@dataclass
class PackedJob:
    """A validated, packed job: nothing uploaded yet."""

    accelerator: Accelerator
    local_data: list[Data]
    payload: bytes
    context: bytes
    fuse: list[FuseMount]

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

    ``batch_inputs`` / ``input_refs``: a batch's shared payload (see ``core.batch``).
    """
    accel = parse_accelerator(request.accelerator_spec)
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
    local = [d for d, _, _ in found if d.uploads]
    return PackedJob(accel, local, payload, build_context(request, excludes, local), fuse)


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


def create_job(store: ObjectStore, backend: Backend, spec: JobSpec, handle: JobHandle) -> None:
    """Write ``handle.json``, then create the job.

    If creation fails and the job does not exist after all, the job's artifacts are
    removed (nothing is left that looks like a job) and the error is re-raised.
    """
    job_id = spec.job_id
    store.write_bytes(
        artifact_key(job_id, "handle.json"), handle.to_json(), content_type="application/json"
    )
    make_private(store, artifact_key(job_id, "handle.json"))
    try:
        backend.submit(spec)
    except Exception:
        if backend.exists(handle):
            log.warning("create reported an error but job %s exists; keeping it", job_id)
            return
        log.error("could not create job %s; removing its artifacts", job_id)
        store.delete_prefix(f"{job_id}/")
        raise


def make_private(store: ObjectStore, key: str) -> None:
    """On a local store, job data is owner-only (0600); a bucket has IAM instead."""
    restrict = getattr(store, "make_private", None)
    if restrict is not None:
        restrict(key)


def template_for(
    request: JobRequest,
    packed: PackedJob,
    kind: str,
    *,
    payload_uri: str,
    context_uri: str,
    output_dir: str,
    captured: dict[str, str],
    group_id: str | None = None,
    signing_secret: bytes | None = None,
    image: ImagePlan | None = None,
    requirements_uri: str | None = None,
) -> JobTemplate:
    """The one place a request's options become a job template (jobs and batches).

    ``image``: the task's image plan (its URI is the job's image; its requirements are
    installed from ``requirements_uri`` at start when the plan says so).

    With the deployment's ``signing_secret`` the job signs its result and the
    ``captured`` env travels encrypted, to become secrets of the job; without it
    (kinetic's own runner) the captured env is plain env, as kinetic does it.
    """
    signed = signing_secret is not None
    return JobTemplate(
        backend=kind,
        accelerator=request.accelerator_spec,
        func_name=request.func_name,
        payload_uri=payload_uri,
        payload_sha256=hashlib.sha256(packed.payload).hexdigest(),
        context_uri=context_uri,
        context_sha256=packed.context_sha256,
        output_dir=output_dir,
        env={} if signed else dict(captured),
        sealed_env=encrypt_env(signing_secret, captured) if signed and captured else None,
        identity=dict(request.identity),
        labels=dict(request.extra_labels),
        fuse=list(packed.fuse),
        cpu=request.cpu_request,
        memory=request.memory_request,
        group_id=group_id,
        result_auth=AUTH_HMAC if signed else AUTH_NONE,
        image=image.uri if image is not None else None,
        requirements=list(image.requirements.lines) if image is not None else [],
        requirements_uri=requirements_uri
        if image is not None and image.needs_requirements_upload
        else None,
    )


@dataclass
class PlannedJob:
    """One job, validated and packed, with its spec and handle; nothing uploaded yet."""

    packed: PackedJob
    template: JobTemplate
    spec: JobSpec
    handle: JobHandle
    image: ImagePlan | None = None

    @property
    def output_uri(self) -> str:
        return self.template.output_dir


def plan_job(
    request: JobRequest,
    config: KineticConfig,
    store: ObjectStore,
    job_id: str,
    signing_secret: bytes | None = None,
) -> PlannedJob:
    """Validate, pack and build the spec and handle of one job; uploads nothing
    (dry runs stop here).  With ``signing_secret`` the job signs its result (the
    Airflow layer always passes it; ``None`` is for kinetic's own runner)."""
    kind = config.backend_kind(parse_accelerator(request.accelerator_spec))
    output_uri = request.output_dir or store.uri(f"outputs/{job_id}")
    captured = capture_env(request.capture_env_vars)
    env_vars = {} if signing_secret is not None else dict(captured)  # secrets: not in payload
    env_vars["KINETIC_OUTPUT_DIR"] = function_output_dir(output_uri)
    image = plan_for_request(request, config, kind)  # bad image/requirements: raise here
    packed = prepare(request, store, env_vars)
    template = template_for(
        request,
        packed,
        kind,
        payload_uri=store.uri(artifact_key(job_id, "payload.pkl")),
        context_uri=store.uri(packed.context_key),
        output_dir=output_uri,
        captured=captured,
        signing_secret=signing_secret,
        image=image,
        requirements_uri=store.uri(artifact_key(job_id, "requirements.txt")),
    )
    spec = template.spec(config, store, job_id, signing_secret=signing_secret)
    return PlannedJob(packed, template, spec, template.handle(config, store, spec), image)


def submit_job(
    request: JobRequest,
    config: KineticConfig,
    backend: Backend,
    store: ObjectStore | None = None,
    signing_secret: bytes | None = None,
) -> tuple[JobHandle, JobSpec]:
    """Run the whole submission; returns the handle and the spec it launched."""
    store = store or config.store()
    job_id = request.job_id or new_job_id()
    planned = plan_job(request, config, store, job_id, signing_secret)
    if planned.template.backend != backend.name:
        raise ValueError(
            f"this job runs on the {planned.template.backend!r} backend, not {backend.name!r}"
        )
    # ---- side effects start here --------------------------------------------------
    datacache.upload_all(store, planned.packed.local_data)
    job_context.upload_context(store, planned.packed.context, planned.packed.context_sha256)
    store.write_bytes(artifact_key(job_id, "payload.pkl"), planned.packed.payload)
    make_private(store, artifact_key(job_id, "payload.pkl"))
    if planned.template.requirements_uri:  # prebuilt: installed at pod start
        assert planned.image is not None
        key = artifact_key(job_id, "requirements.txt")
        store.write_bytes(key, planned.image.requirements.text.encode())
        make_private(store, key)
    create_job(store, backend, planned.spec, planned.handle)
    log.info("submitted %s (%s) on backend %s", job_id, planned.spec.name, backend.name)
    return planned.handle, planned.spec
