"""One job template: the request -> spec path, written once for jobs and batch children.

A :class:`JobTemplate` is everything a job is made of once its payload is packed:
which payload and context to run, on what accelerator and backend, with which env,
labels, FUSE mounts, resources and output dir.  A single job is the template run
once; a batch child is the same template plus its input index (its own output
subdirectory, ``KINETIC_GROUP_INDEX`` and group labels).  The job's options travel as
one record (``JobTemplate.options``, a :class:`JobOptions`), so an option added to
``JobOptions`` reaches both kinds of job with no edit here.

The template is JSON-able (``to_dict``/``from_dict``) because a batch carries it
across deferrals; its options are flat in that form (one key per field).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends.k8s.manifests import GROUP_LABEL
from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator, with_spot
from airflow_provider_kinetic.core.catalog.capacity import Capacity
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.jobs.batchwire import GROUP_ID_ENV, GROUP_INDEX_ENV
from airflow_provider_kinetic.core.jobs.checkpoint import checkpoint_env
from airflow_provider_kinetic.core.jobs.options import JobOptions, option_names
from airflow_provider_kinetic.core.jobs.signing import (
    AUTH_HMAC,
    AUTH_NONE,
    RESULT_KEY_ENV,
    decrypt_env,
    job_key,
    key_id,
    ring_of,
)
from airflow_provider_kinetic.core.keys.peer.registry import peer_token
from airflow_provider_kinetic.core.spec.handles import JobHandle, artifact_key, utc_now_iso
from airflow_provider_kinetic.core.spec.peerport import SCOPE_ENV, TOKEN_ENV
from airflow_provider_kinetic.core.spec.pod import (
    KINETIC_RUNNER_COMMAND,
    JobSpec,
    SpecInputs,
    build_job_spec,
)
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.fileuri import FILE_PREFIX, file_uri_path

#: kinetic's prebuilt image naming ({repo}/base-{category}:{kinetic version}); set the
#: connection's ``image`` to your own registry's copy.
DEFAULT_IMAGE = "kinetic/base-{category}:0.0.4"
GROUP_INDEX_LABEL = "kinetic-group-index"


def function_output_dir(uri: str) -> str:
    """What the function sees in ``KINETIC_OUTPUT_DIR``: a path for ``file://`` stores,
    percent-decoded by the one ``file://`` rule (``core/storage/fileuri.py``), so it is
    the directory a downstream ``Data(<the output_dir XCom>)`` reads."""
    return file_uri_path(uri) if uri.startswith(FILE_PREFIX) else uri


@dataclass
class JobTemplate:
    """A packed job, minus its id (and, for batch children, minus its index)."""

    backend: str
    func_name: str
    payload_uri: str
    payload_sha256: str
    context_uri: str
    context_sha256: str
    output_dir: str
    env: dict[str, str] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)
    fuse: list[FuseMount] = field(default_factory=list)
    #: How and where every job of the template runs, resolved: its capacity chain
    #: spelled out, a job made for one step of it (``spec(step=)``).
    options: JobOptions = field(default_factory=JobOptions)
    group_id: str | None = None
    #: ``hmac-sha256``: the runner gets a per-job key (as a secret) and signs its result.
    result_auth: str = AUTH_NONE
    #: Captured env values, encrypted with the deployment secret: they reach the job as
    #: secrets (Kubernetes Secret / 0600 file), never as plain env, payload or state.
    sealed_env: str | None = None
    #: The job's image, resolved once per task (``core.runtime.images``); None: the
    #: connection's ``image`` or kinetic's default name (the local backend ignores it).
    image: str | None = None
    #: The task's filtered requirement lines (the local backend builds its venv from them).
    requirements: list[str] = field(default_factory=list)
    #: Uploaded requirements the runner installs at start (``--requirements-gcs``).
    requirements_uri: str | None = None
    #: The work segment of the checkpoint slots (``core.jobs.checkpoint.work_slot``):
    #: set once the work digest is known; None: one slot per task run (``"any"``).
    checkpoint_work: str | None = None

    # ---- per job ------------------------------------------------------------------
    def output_uri(self, index: int | None = None) -> str:
        """The job's output dir URI; a batch child writes under ``{output_dir}/{index}``."""
        return self.output_dir if index is None else f"{self.output_dir.rstrip('/')}/{index}"

    def spec(
        self,
        config: KineticConfig,
        store: ObjectStore,
        job_id: str,
        index: int | None = None,
        signing_secret: bytes | None = None,
        step: int = 0,
    ) -> JobSpec:
        """The JobSpec of one job made from this template (no I/O).

        ``signing_secret``: the deployment secret the job's result key derives from
        (required when ``result_auth`` is ``hmac-sha256``; never stored anywhere).
        """
        secrets: dict[str, str] = {}
        if (self.result_auth == AUTH_HMAC or self.sealed_env) and signing_secret is None:
            raise ValueError("a signed job needs the deployment's signing secret")
        if self.sealed_env:
            secrets.update(decrypt_env(signing_secret, self.sealed_env))
        if self.result_auth == AUTH_HMAC:
            secrets[RESULT_KEY_ENV] = job_key(signing_secret, job_id)
        options = self.options
        env = dict(self.env)
        # Peers (core/keys/peer/registry.py): one scope per batch (every child) or per job (every
        # LWS host), for file and tensor broadcasts alike; the token only when signed.
        env[SCOPE_ENV] = self.group_id or job_id
        if self.result_auth == AUTH_HMAC:
            secrets[TOKEN_ENV] = peer_token(signing_secret, env[SCOPE_ENV])
        # The checkpoint slot: per task run and work, and per input for a batch child.
        env.update(
            checkpoint_env(
                store, self.identity, job_id, index, options.checkpoint_sync_s, self.checkpoint_work
            )
        )
        labels = dict(options.labels)
        if index is not None:
            env[GROUP_INDEX_ENV] = str(index)
            labels[GROUP_INDEX_LABEL] = str(index)
        if self.group_id is not None:
            labels[GROUP_LABEL] = self.group_id
            env[GROUP_ID_ENV] = self.group_id
        capacity = self.capacity_step(step)
        accel = parse_accelerator(with_spot(options.accelerator, capacity.kind == "spot"))
        spec = build_job_spec(
            SpecInputs(
                job_id=job_id,
                bucket=store.bucket,
                context_uri=self.context_uri,
                payload_uri=self.payload_uri,
                result_uri=store.uri(artifact_key(job_id, "result.pkl")),
                payload_sha256=self.payload_sha256,
                context_sha256=self.context_sha256,
                accelerator=accel,
                image=self.image or config.image or DEFAULT_IMAGE.format(category=accel.category),
                requirements_uri=self.requirements_uri,
                output_dir=function_output_dir(self.output_uri(index)),
                namespace=config.namespace,
                service_account=config.service_account,
                runner_command=config.runner_command or list(KINETIC_RUNNER_COMMAND),
                env=env,
                identity=self.identity,
                extra_labels=labels,
                fuse=list(self.fuse),
                secrets=secrets,
                ttl_seconds=config.ttl_seconds_after_finished,
                capacity=capacity,
                **options.pod_inputs(),  # resources, priority, run limit: by construction
            )
        )
        spec.requirements = list(self.requirements)
        if self.result_auth == AUTH_HMAC:
            spec.result_key_id = key_id(ring_of(signing_secret)[0])
        return spec

    def capacity_step(self, step: int) -> Capacity:
        """Step ``step`` of the capacity chain (the last one past its end)."""
        chain = self.options.capacity_chain
        return chain[min(step, len(chain) - 1)]

    def handle(
        self,
        config: KineticConfig,
        store: ObjectStore,
        spec: JobSpec,
        index: int | None = None,
        step: int = 0,
    ) -> JobHandle:
        """The JobHandle of a job about to be created from ``spec`` (for ``step``)."""
        group: dict[str, Any] = {}
        if self.group_id is not None:
            group = {"group_id": self.group_id, "group_kind": "map", "group_index": index}
        return JobHandle(
            job_id=spec.job_id,
            backend=self.backend,
            project=config.project or "",
            cluster_name=config.cluster or "",
            zone=config.zone or "",
            namespace=config.namespace,
            bucket_name=store.bucket,
            k8s_name=backend_class(self.backend).object_name(spec.job_id),
            image_uri=spec.container["image"],
            accelerator=with_spot(
                self.options.accelerator, self.capacity_step(step).kind == "spot"
            ),
            func_name=self.func_name,
            display_name=f"kinetic-{self.func_name}-{spec.job_id}",
            created_at=utc_now_iso(),
            output_dir=self.output_uri(index),
            result_auth=self.result_auth,
            result_key_id=spec.result_key_id,
            capacity=str(self.capacity_step(step)),
            num_slices=self.options.num_slices if self.options.num_slices > 1 else None,
            debug=self.options.debug_port is not None,
            debug_port=self.options.debug_port,
            capacity_wait_s=self.options.capacity_wait_s
            if step + 1 < len(self.options.capacity_chain)
            else None,
            **group,
        )

    # ---- wire form ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The template as JSON-able data; its options' fields sit beside its own."""
        out = asdict(self)
        out.update(out.pop("options"))
        out["fuse"] = [[m.uri, m.mount_path, m.is_dir] for m in self.fuse]
        return out

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> JobTemplate:
        data = {k: v for k, v in value.items() if k not in option_names()}
        data["fuse"] = [FuseMount(*m) for m in data.get("fuse") or []]
        return cls(**data, options=JobOptions.from_dict(value))
