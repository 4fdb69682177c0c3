"""Submission: validate, hash, pack (``pack.py``), upload, create — in that order.

Every check that can fail on bad input runs before the first byte is uploaded.
If the backend cannot create the job, the job's artifacts are deleted again, so
nothing is left behind that looks like a job.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace

from airflow_provider_kinetic.core.backends.base import Backend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.jobs import history
from airflow_provider_kinetic.core.jobs.checkpoint import has_task_ids, work_slot
from airflow_provider_kinetic.core.jobs.history import DATA_HASHES
from airflow_provider_kinetic.core.jobs.outputs import start_empty
from airflow_provider_kinetic.core.jobs.pack import OUTPUT_DIR_ENV, PackedJob, prepare
from airflow_provider_kinetic.core.jobs.request import (
    JobRequest,
    capture_env,
    plan_for_request,
)
from airflow_provider_kinetic.core.jobs.resultcache import CACHE_KEY_FIELD
from airflow_provider_kinetic.core.jobs.signing import AUTH_HMAC, AUTH_NONE, encrypt_env
from airflow_provider_kinetic.core.jobs.template import JobTemplate, function_output_dir
from airflow_provider_kinetic.core.jobs.work import reuse_key, template_options, work_digest
from airflow_provider_kinetic.core.runtime import context as job_context
from airflow_provider_kinetic.core.runtime.images import ImagePlan
from airflow_provider_kinetic.core.spec.handles import JobHandle, artifact_key, new_job_id
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger(__name__)


def create_job(store: ObjectStore, backend: Backend, spec: JobSpec, handle: JobHandle) -> None:
    """Write ``handle.json``, then create the job.

    If creation fails and the job does not exist after all, the job's artifacts are
    removed (nothing is left that looks like a job) and the error is re-raised.
    """
    job_id = spec.job_id
    write_handle(store, handle)
    try:
        backend.submit(spec)
    except Exception:
        if backend.exists(handle):
            log.warning("create reported an error but job %s exists; keeping it", job_id)
            return
        log.error("could not create job %s; removing its artifacts", job_id)
        store.delete_prefix(f"{job_id}/")
        raise


def create_child(store: ObjectStore, backend: Backend, spec: JobSpec, handle: JobHandle) -> None:
    """Create a batch child, then write its ``handle.json``: for a child it is the record
    that its create was answered (its intent is the batch's launch record, written
    before, ``core.batch.launch``), so a driver that restarts tells a child created
    and gone since from one never created without a second object per child.

    A create that errs but made the job after all keeps it; one whose record cannot
    be written deletes the job again (nothing runs that no record names) and raises.
    """
    try:
        backend.submit(spec)
    except Exception:
        if not backend.exists(handle):
            raise
        log.warning("create reported an error but job %s exists; keeping it", spec.job_id)
    try:
        write_handle(store, handle)
    except Exception:
        log.error("could not record job %s as created; deleting it again", spec.job_id)
        backend.cancel(handle)
        raise


def write_handle(store: ObjectStore, handle: JobHandle) -> None:
    key = artifact_key(handle.job_id, "handle.json")
    store.write_bytes(key, handle.to_json(), content_type="application/json")
    make_private(store, key)


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
    """The one place a request becomes a job template (jobs and batches); its options
    travel as one record (``request.options``, resolved: the capacity chain spelled out).

        ``image``: the task's image plan (its URI is the job's image; its requirements are
        installed from ``requirements_uri`` at start when the plan says so).

        With the deployment's ``signing_secret`` the job signs its result and the
        ``captured`` env travels encrypted, to become secrets of the job; without it
        (kinetic's own runner) the captured env is plain env, as kinetic does it.
    """
    signed = signing_secret is not None
    return JobTemplate(
        backend=kind,
        func_name=request.func_name,
        payload_uri=payload_uri,
        payload_sha256=hashlib.sha256(packed.payload).hexdigest(),
        context_uri=context_uri,
        context_sha256=packed.context_sha256,
        output_dir=output_dir,
        env={} if signed else dict(captured),
        sealed_env=encrypt_env(signing_secret, captured) if signed and captured else None,
        identity=dict(request.identity),
        fuse=list(packed.fuse),
        options=request.options.resolved(),
        group_id=group_id,
        result_auth=AUTH_HMAC if signed else AUTH_NONE,
        image=image.uri if image is not None else None,
        requirements=list(image.requirements.lines) if image is not None else [],
        requirements_uri=requirements_uri
        if image is not None and image.needs_requirements_upload
        else None,
    )


def checkpoint_slots(template: JobTemplate, work: str | None) -> None:
    """Key ``template``'s checkpoint slots on ``work`` (``checkpoint_restore="same_work"``)
    or on the task run alone (``"any"``), and say which in the log."""
    restore = template.options.checkpoint_restore
    template.checkpoint_work = work_slot(work, restore)
    if not has_task_ids(template.identity):
        return
    if template.checkpoint_work:
        log.info(
            "checkpoints: restored only from this work's (work %s; checkpoint_restore="
            "'same_work'): a try of other work starts from an empty KINETIC_CHECKPOINT_DIR",
            template.checkpoint_work[:12],
        )
    else:
        log.info(
            "checkpoints: one slot per task run (checkpoint_restore=%r): a try restores "
            "the last checkpoint of this task run, whatever work wrote it",
            restore,
        )


def use_default_capacity(request: JobRequest, config: KineticConfig) -> None:
    """A request that names no capacity gets the connection's (``capacity`` extra),
    checked against the accelerator here (InvalidCapacityError naming the value),
    before anything is packed."""
    request.options = request.options.with_default_capacity(config.capacity)


@dataclass
class PlannedJob:
    """One job, validated and packed, with its spec and handle; nothing uploaded yet."""

    packed: PackedJob
    template: JobTemplate
    spec: JobSpec
    handle: JobHandle
    image: ImagePlan | None = None
    #: ``core.jobs.work.work_digest`` of this job (None: not computable).
    work: str | None = None
    #: With ``cache=True``: the key its result is reused under (``core.jobs.resultcache``);
    #: None: off, or a call that cannot be compared.
    cache_key: str | None = None

    @property
    def output_uri(self) -> str:
        return self.template.output_dir


def plan_job(
    request: JobRequest,
    config: KineticConfig,
    store: ObjectStore,
    job_id: str,
    signing_secret: bytes | None = None,
    step: int = 0,
) -> PlannedJob:
    """Validate, pack and build the spec and handle of one job; uploads nothing
    (dry runs stop here).  With ``signing_secret`` the job signs its result (the
    Airflow layer always passes it; ``None`` is for kinetic's own runner)."""
    kind = config.backend_kind(request.options.accelerator, request.options.num_slices)
    use_default_capacity(request, config)
    output_uri = request.output_dir or store.uri(f"outputs/{job_id}")
    captured = capture_env(request.capture_env_vars)
    env_vars = {} if signing_secret is not None else dict(captured)  # secrets: not in payload
    env_vars[OUTPUT_DIR_ENV] = function_output_dir(output_uri)
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
    work = None
    if packed.call_sha256 is not None:
        options = template_options(template, request.capture_env_vars)
        work = work_digest(call=packed.call_sha256, options=options)
    checkpoint_slots(template, work)
    spec = template.spec(config, store, job_id, signing_secret=signing_secret, step=step)
    handle = template.handle(config, store, spec, step=step)
    if packed.data_hashes:  # what the job reads: data gc keeps it while the job is known
        handle = replace(handle, extra={**handle.extra, DATA_HASHES: packed.data_hashes})
    key = cache_key_for(request, template, packed.reuse_call)
    if key is not None:  # whoever finishes the job (a resumed deferral too) caches it
        handle = replace(handle, extra={**handle.extra, CACHE_KEY_FIELD: key})
    return PlannedJob(packed, template, spec, handle, image, work, key)


def cache_key_for(request: JobRequest, template: JobTemplate, call: str | None) -> str | None:
    """The reuse key (``core.jobs.work.reuse_key``) of a call (``pack.reuse_call``: a
    job's, or one batch input's): the work digest of the call as ``cache_ignore``
    leaves it, the job's options less the task run's default output dir, and
    ``cache_version``."""
    if request.cache is None or call is None:
        return None
    options = template_options(template, request.capture_env_vars)
    if request.cache.default_output:
        options.pop("output_dir", None)
    return reuse_key(work_digest(call=call, options=options), request.cache.version)


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
    submit_planned(planned, backend, store)
    return planned.handle, planned.spec


def submit_planned(planned: PlannedJob, backend: Backend, store: ObjectStore) -> None:
    """Upload a planned job's data, context, payload (and requirements), then create it."""
    job_id = planned.spec.job_id
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
    start_empty(store, planned.template.output_dir, f"job {job_id}")
    create_job(store, backend, planned.spec, planned.handle)
    log.info("submitted %s (%s) on backend %s", job_id, planned.spec.name, backend.name)
    history.job_submitted(
        store, planned.handle, planned.template.identity, backend.logs_url(planned.handle)
    )
