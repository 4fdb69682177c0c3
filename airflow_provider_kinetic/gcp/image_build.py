"""Bundled images: find the tag in Artifact Registry, else build it once with Cloud Build.

``core.runtime.images`` decides the image (URI, tag, Dockerfile) without I/O; this
module makes it exist.  The tag is looked up first (``get_tag``): a hit builds
nothing.  On a miss the build context (Dockerfile, requirements, this package's
wheel, the runner shim) goes to the jobs bucket as one ``.tar.gz`` and one Cloud
Build runs ``docker build`` with ``images=[uri]``, through providers-google's
``CloudBuildHook``; its status and step transitions are logged while it runs, and a
build that does not succeed raises :class:`ImageBuildError` carrying its log URL.

An image for arm64 hosts (``plan.arch``; GB200) is built on Cloud Build's x86 workers
through QEMU: one step registers the arm64 binfmt handler (``BINFMT_IMAGE``), the next
is the same ``docker build`` with ``--platform linux/arm64``, and Cloud Build pushes
it as it pushes any image (``images=[uri]``).

The build logs to the jobs bucket only (``GCS_ONLY``, ``logs_bucket`` =
``gs://{bucket}/_builds/logs``), not to Cloud Logging: one object the task can read
with the store's own client, so the build's lines are copied into the task log as it
runs (``gcp/build_log.py``) and a failed build's last lines go into the error.  A
successful build's log object is deleted afterwards (its lines are in the task log);
a failed one's is kept and named in the error.

Credentials are those of the connection's ``gcp_conn_id`` / ``impersonation_chain``,
as for the store and the cluster.

Seam for rehearsals and tests: with ``KINETIC_IMAGE_API_ENDPOINT`` set (an
``http://host:port`` base URL, like ``STORAGE_EMULATOR_HOST`` for the store) both
clients talk REST to that endpoint with anonymous credentials.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.jobs.polling import poll_delays
from airflow_provider_kinetic.core.runtime.buildfiles import build_context, context_tarball
from airflow_provider_kinetic.core.runtime.images import ImagePlan
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.gcp.build_log import MAX_LINES_PER_READ, BuildLogTail

log = logging.getLogger(__name__)

ENDPOINT_ENV = "KINETIC_IMAGE_API_ENDPOINT"
DOCKER_BUILDER = "gcr.io/cloud-builders/docker"
#: Registers QEMU binfmt handlers so a build step can run another architecture's code.
BINFMT_IMAGE = "tonistiigi/binfmt"
BUILD_TIMEOUT_S = 1200
#: Where build contexts are uploaded in the jobs bucket (deleted after the build).
BUILDS_PREFIX = "_builds"
#: Where Cloud Build writes its logs in the jobs bucket (``log-{build_id}.txt``).
LOGS_PREFIX = f"{BUILDS_PREFIX}/logs"
FIRST_POLL_S = 0.25
_DONE = {"SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED"}


class ImageBuildError(KineticError, RuntimeError):
    """A bundled image could not be found or built; names the build and its log URL."""

    def __init__(self, message: str, log_url: str | None = None):
        super().__init__(message)
        self.log_url = log_url


def _endpoint() -> str | None:
    return os.environ.get(ENDPOINT_ENV) or None


def _cloud_build_hook_class() -> type:
    """providers-google's CloudBuildHook, with the endpoint seam in ``get_conn``."""
    from airflow.providers.google.cloud.hooks.cloud_build import CloudBuildHook

    class KineticCloudBuildHook(CloudBuildHook):
        """``get_conn`` builds the client as CloudBuildHook does, except that with
        ``KINETIC_IMAGE_API_ENDPOINT`` it speaks REST to that endpoint, anonymously."""

        def get_conn(self, location: str = "global") -> Any:
            endpoint = _endpoint()
            if endpoint is None:
                return super().get_conn(location=location)
            if location not in self._client:
                from google.api_core.client_options import ClientOptions
                from google.auth.credentials import AnonymousCredentials
                from google.cloud.devtools.cloudbuild_v1 import CloudBuildClient

                self._client[location] = CloudBuildClient(
                    credentials=AnonymousCredentials(),
                    transport="rest",
                    client_options=ClientOptions(api_endpoint=endpoint),
                )
            return self._client[location]

    return KineticCloudBuildHook


class ImageBuildHook:
    """Make a task's bundled image exist (see module docstring)."""

    def __init__(
        self,
        config: KineticConfig,
        *,
        poll_interval: float = 5.0,
        timeout_s: float = BUILD_TIMEOUT_S + 300,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        log_lines_per_poll: int = MAX_LINES_PER_READ,
    ) -> None:
        """``log_lines_per_poll`` bounds the build-log lines shown per poll, so status
        polling keeps its pace however much the build prints."""
        self.config = config
        self.log_lines_per_poll = log_lines_per_poll
        self.poll_interval = poll_interval
        self.timeout_s = timeout_s
        self._clock, self._sleep = clock, sleep
        self._registry: Any = None
        self._builds: Any = None

    # ---- clients ------------------------------------------------------------------
    def registry_client(self) -> Any:
        """An Artifact Registry client with the connection's credentials."""
        if self._registry is None:
            try:
                from google.cloud import artifactregistry_v1
            except ImportError as exc:
                raise ImportError(
                    f"bundled images need google-cloud-artifact-registry ({exc}); "
                    'install "airflow-provider-kinetic[gke]"'
                ) from exc
            endpoint = _endpoint()
            if endpoint is not None:
                from google.api_core.client_options import ClientOptions
                from google.auth.credentials import AnonymousCredentials

                self._registry = artifactregistry_v1.ArtifactRegistryClient(
                    credentials=AnonymousCredentials(),
                    transport="rest",
                    client_options=ClientOptions(api_endpoint=endpoint),
                )
            else:
                self._registry = artifactregistry_v1.ArtifactRegistryClient(
                    credentials=self.cloud_build_hook().get_credentials()
                )
        return self._registry

    def cloud_build_hook(self) -> Any:
        """providers-google's CloudBuildHook on the connection's ``gcp_conn_id``."""
        if self._builds is None:
            self._builds = _cloud_build_hook_class()(
                gcp_conn_id=self.config.gcp_conn_id,
                impersonation_chain=self.config.impersonation_chain,
            )
        return self._builds

    # ---- lookup -------------------------------------------------------------------
    def exists(self, plan: ImagePlan) -> bool:
        """Whether the plan's tag is in its Artifact Registry repository."""
        from google.api_core import exceptions as gexc

        if plan.mode != "bundled" or plan.registry is None or plan.tag is None:
            raise ValueError(f"only a bundled image is looked up, not a {plan.mode} one")
        try:
            self.registry_client().get_tag(name=plan.registry.tag_name(plan.tag))
        except gexc.NotFound:
            return False
        except gexc.GoogleAPICallError as exc:
            raise ImageBuildError(
                f"cannot look up image tag {plan.tag} in {plan.registry.image}: {exc}; the "
                "connection's identity needs Artifact Registry read access (and the "
                f"repository {plan.registry.repository!r} must exist in "
                f"{plan.registry.location})"
            ) from exc
        return True

    # ---- build --------------------------------------------------------------------
    def ensure(self, plan: ImagePlan, store: ObjectStore) -> bool:
        """Make a bundled image exist; True when it was built now, False when found.

        Other modes need nothing here (a prebuilt or custom image is the user's)."""
        if plan.mode != "bundled":
            return False
        if self.exists(plan):
            log.info("kinetic image %s exists (tag %s): nothing to build", plan.uri, plan.tag)
            return False
        if store.scheme != "gs":
            raise ImageBuildError(
                f"building {plan.uri} needs a GCS jobs bucket for the build context, "
                f"not {store.uri('')!r}"
            )
        folder = f"{BUILDS_PREFIX}/{plan.tag}-{os.urandom(4).hex()}"
        key = f"{folder}/context.tar.gz"
        store.write_bytes(key, context_tarball(build_context(plan)))
        try:
            self._build(plan, store, key)
        finally:
            store.delete_prefix(folder)
        return True

    def build_request(self, plan: ImagePlan, bucket: str, key: str) -> Any:
        """The Cloud Build ``Build``: one ``docker build`` step (for arm64 hosts: binfmt,
        then the build with ``--platform``), the image pushed."""
        from google.cloud.devtools.cloudbuild_v1 import types as cb
        from google.protobuf import duration_pb2

        return cb.Build(
            source=cb.Source(storage_source=cb.StorageSource(bucket=bucket, object_=key)),
            steps=[cb.BuildStep(name=DOCKER_BUILDER, args=args) for args in build_steps(plan)],
            images=[plan.uri],
            timeout=duration_pb2.Duration(seconds=BUILD_TIMEOUT_S),
            # The log goes to the jobs bucket, where the task can follow it.
            logs_bucket=f"gs://{bucket}/{LOGS_PREFIX}",
            options=cb.BuildOptions(logging=cb.BuildOptions.LoggingMode.GCS_ONLY),
            tags=["kinetic", f"kinetic-{plan.category}", f"kinetic-{plan.arch}"],
        )

    def _build(self, plan: ImagePlan, store: ObjectStore, key: str) -> None:
        """Run one build to its end.  Each poll reads the status first, then the log's
        new lines, so the task log shows the build's progress and output as it comes;
        after the end the rest of the log is shown before success or the error."""
        assert plan.registry is not None
        hook = self.cloud_build_hook()
        project, location = plan.registry.project, plan.registry.location
        log.info("kinetic image %s not found: building it with Cloud Build", plan.uri)
        _, build_id = hook.create_build_without_waiting_for_result(
            build=self.build_request(plan, store.bucket, key),
            project_id=project,
            location=location,
        )
        tail = BuildLogTail(
            _storage_client(store, self.config),
            store.bucket,
            f"{LOGS_PREFIX}/log-{build_id}.txt",
            log,
            max_lines=self.log_lines_per_poll,
        )
        deadline = self._clock() + self.timeout_s
        seen: dict[str, str] = {}
        # A build takes minutes, but a lookup that raced another task's build, or a
        # tiny one, ends sooner: first polls come fast, then every poll_interval.
        delays = poll_delays(self.poll_interval, FIRST_POLL_S)
        while True:
            build = hook.get_build(id_=build_id, project_id=project, location=location)
            self._log_progress(build, seen)
            status = build.status.name
            if status in _DONE:
                break
            tail.poll()
            if self._clock() > deadline:
                raise ImageBuildError(
                    f"Cloud Build {build_id} for {plan.uri} did not finish within "
                    f"{self.timeout_s:.0f} s (status {status}); logs: {build.log_url} "
                    f"({tail.uri}){_last_lines(tail)}",
                    build.log_url,
                )
            self._sleep(next(delays))
        complete = tail.drain()
        if status != "SUCCESS":
            detail = f": {build.status_detail}" if build.status_detail else ""
            raise ImageBuildError(
                f"Cloud Build {build_id} for image {plan.uri} ended {status}{detail}; "
                f"build log: {build.log_url} ({tail.uri}){_last_lines(tail)}",
                build.log_url,
            )
        if complete:
            tail.delete()
        log.info("kinetic image %s built (Cloud Build %s)", plan.uri, build_id)

    @staticmethod
    def _log_progress(build: Any, seen: dict[str, str]) -> None:
        """One log line per status change of the build and of each step."""
        if seen.get("build") != build.status.name:
            seen["build"] = build.status.name
            log.info("Cloud Build %s: %s (log: %s)", build.id, build.status.name, build.log_url)
        for i, step in enumerate(build.steps):
            key = f"step{i}"
            if step.status.name != "STATUS_UNKNOWN" and seen.get(key) != step.status.name:
                seen[key] = step.status.name
                args = " ".join(step.args)
                log.info(
                    "Cloud Build %s step %d (%s %s): %s",
                    build.id,
                    i,
                    step.name,
                    args,
                    step.status.name,
                )


def build_steps(plan: ImagePlan) -> list[list[str]]:
    """The docker builder's arguments, one list per step, for ``plan``'s platform."""
    build = ["build", "--network=cloudbuild", "-t", plan.uri, "."]
    if plan.arch == "amd64":  # Cloud Build's workers are x86-64: a plain build
        return [build]
    return [
        ["run", "--privileged", "--rm", BINFMT_IMAGE, "--install", plan.arch],
        [build[0], "--platform", plan.platform, *build[1:]],
    ]


def _storage_client(store: ObjectStore, config: KineticConfig) -> Any:
    """The store's own storage client (its credentials read the build log too)."""
    from airflow_provider_kinetic.core.storage.gcs import GcsStore, make_client

    return store.client if isinstance(store, GcsStore) else make_client(config.project)


def _last_lines(tail: BuildLogTail) -> str:
    """The build log's last lines, for an error message (empty when none were read)."""
    lines = tail.last_lines
    if not lines:
        return ""
    return f"\nlast {len(lines)} line(s) of the build log:\n  " + "\n  ".join(lines)


def prepare_image(plan: ImagePlan, config: KineticConfig, store: ObjectStore) -> ImagePlan:
    """The Airflow layer's one call before a task submits: a bundled image is found
    or built; every other mode passes through (a note on its platform, when the hosts
    are not amd64, goes to the log).  Returns ``plan``."""
    if plan.mode == "bundled":
        ImageBuildHook(config).ensure(plan, store)
    elif plan.platform_note:
        log.warning("kinetic: %s", plan.platform_note)
    return plan
