"""Which container image a job runs in, decided once per task and without I/O.

``container_image`` (operator option, else connection extra) is one of:

* a URI (anything else): used as is; the connection's older ``image`` extra means
  the same;
* ``"prebuilt"``: ``{base_image_repo}/base-{cpu|gpu|tpu}:{package version}``, images
  published from ``docker/`` (``docs/RUNTIME_IMAGES.md``); the job's requirements are
  uploaded as ``{job_id}/requirements.txt`` and installed at pod start
  (``--requirements-gcs``);
* ``"bundled"`` (the default on a cluster backend when nothing is configured): an
  image built from :func:`render_dockerfile` with the requirements baked in, in an
  Artifact Registry repository, tagged ``{category}-{sha256(inputs)[:12]}``.  The
  inputs are everything that makes the image: base image, category, this package's
  version and files, the filtered requirements and the Dockerfile itself; so equal
  inputs find the image already built, and cpu/gpu/tpu images never collide.

The image must run on the accelerator's hosts (``Accelerator.arch``): GB200 (A4X)
hosts are arm64.  A bundled image for them is built for ``linux/arm64`` and tagged
``{category}-arm64-{hash}`` (the platform is one of the hashed inputs, so it never
shares a tag with the amd64 image of the same content).  A prebuilt or custom image's
platforms are not known here: it is used as is and the plan says it must have an arm64
variant (dry runs and the task log show it).  A category whose JAX is not published
for the hosts' architecture (libtpu: x86-64 only) fails here, before any upload.

The same :func:`render_dockerfile` writes ``docker/Dockerfile.{category}`` (the
prebuilt images, via ``core/runtime/buildfiles.py``; a test checks the files are
current).  The local backend runs
jobs on this machine and ignores images altogether (``mode="local"``).
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.runtime import wheel
from airflow_provider_kinetic.core.runtime.requirements import (
    Requirements,
    normalise_name,
    resolve_requirements,
)

MODES = ("bundled", "prebuilt")
CATEGORIES = ("cpu", "gpu", "tpu")
#: The host architectures each category's image can be built for: its JAX wheels
#: (jax, jax[cuda12]: x86-64 and aarch64; libtpu for jax[tpu]: x86-64 only).
CATEGORY_ARCHES = {"cpu": ("amd64", "arm64"), "gpu": ("amd64", "arm64"), "tpu": ("amd64",)}
DEFAULT_ARCH = "amd64"
UV_IMAGE = "ghcr.io/astral-sh/uv:0.11.1"
#: Python of the published prebuilt images (the oldest this package supports).
PUBLISHED_PYTHON = "3.11"
#: kinetic's package name inside the repository: ``.../{repo}/base:{tag}``.
BUNDLED_PACKAGE = "base"
DIST_DIR = "/tmp/kinetic-dist"
#: The JAX build each category needs (and the find-links the TPU wheels live on).
JAX_SPECS = {"cpu": ["jax"], "gpu": ["jax[cuda12]"], "tpu": ["jax[tpu]>=0.4.6"]}
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"
RUNTIME_PACKAGES = ["cloudpickle", "google-cloud-storage"]
_URI = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")
_REPO = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")


class ImageConfigError(KineticError, ValueError):
    """A container image setting that cannot work; names the value and what is allowed."""


@dataclass(frozen=True)
class RegistryTarget:
    """An Artifact Registry Docker repository: where bundled images live."""

    project: str
    location: str
    repository: str

    @property
    def image(self) -> str:
        """The image path without tag."""
        host = f"{self.location}-docker.pkg.dev"
        return f"{host}/{self.project}/{self.repository}/{BUNDLED_PACKAGE}"

    def tag_name(self, tag: str) -> str:
        """The tag's resource name (Artifact Registry ``get_tag``)."""
        return (
            f"projects/{self.project}/locations/{self.location}/repositories/"
            f"{self.repository}/packages/{BUNDLED_PACKAGE}/tags/{tag}"
        )


@dataclass
class ImagePlan:
    """The image a task's jobs run in, and what has to happen for it to exist."""

    mode: str  # bundled | prebuilt | custom | local
    uri: str | None
    category: str
    tag: str | None = None
    dockerfile: str | None = None
    requirements: Requirements = field(default_factory=Requirements)
    #: The requirements are uploaded with the job and installed at pod start.
    needs_requirements_upload: bool = False
    registry: RegistryTarget | None = None
    #: The hosts' CPU architecture (the accelerator's); a bundled image is built for it.
    arch: str = DEFAULT_ARCH
    #: The accelerator, as written in messages (None when the plan was made from a category).
    accelerator: str | None = None

    @property
    def platform(self) -> str:
        """The container platform the image must have: ``linux/{arch}``."""
        return f"linux/{self.arch}"

    @property
    def platform_note(self) -> str | None:
        """What a person must know about the platform; None when nothing is unsure."""
        if self.arch == DEFAULT_ARCH or self.mode not in ("prebuilt", "custom"):
            return None
        what = f"accelerator {self.accelerator!r}" if self.accelerator else "the accelerator"
        return (
            f"{what} runs on {self.arch} hosts: this {self.mode} image must have a "
            f"{self.platform} variant (its platforms are not checked; container_image="
            f"'bundled' builds one for {self.platform})"
        )

    def describe(self) -> str:
        """One line for logs and dry runs."""
        if self.mode == "local":
            return "local backend: no image (the job runs on this machine)"
        n = len(self.requirements.installable)
        reqs = f"{n} requirement(s)" + (
            " installed at start" if self.needs_requirements_upload and n else ""
        )
        arm = self.mode == "bundled" and self.arch != DEFAULT_ARCH
        platform = f", built for {self.platform}" if arm else ""
        note = f"; {self.platform_note}" if self.platform_note else ""
        return f"{self.mode} image {self.uri} ({reqs}{platform}){note}"


def python_minor() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _quote(spec: str) -> str:
    return f"'{spec}'" if any(c in spec for c in "[]<>=!~; ") else spec


def render_dockerfile(category: str, python: str, with_requirements: bool) -> str:
    """The runner image for ``category``: Python ``python``, uv, the category's JAX,
    the runtime packages, this package (no deps: no Airflow in the image) and, for
    a bundled image, the job's requirements."""
    check_category(category)
    jax = " ".join(_quote(s) for s in JAX_SPECS[category])
    links = f" --find-links {LIBTPU_FIND_LINKS}" if category == "tpu" else ""
    lines = [
        "# Generated by airflow_provider_kinetic.core.runtime.images.render_dockerfile;",
        "# regenerate instead of editing (tests/unit/core/runtime/test_images.py checks docker/).",
        f"ARG PYTHON_VERSION={python}",
        "FROM python:${PYTHON_VERSION}-slim",
        f"COPY --from={UV_IMAGE} /uv /uvx /usr/local/bin/",
        "RUN apt-get update && apt-get install -y --no-install-recommends build-essential"
        " && rm -rf /var/lib/apt/lists/*",
        f"RUN uv pip install --system{links} {jax} {' '.join(RUNTIME_PACKAGES)}",
        f"COPY dist/ {DIST_DIR}/",
        f"RUN uv pip install --system --no-deps {DIST_DIR}/{wheel.PACKAGE}-*.whl",
    ]
    if with_requirements:
        lines += [
            "COPY requirements.txt /tmp/requirements.txt",
            "RUN uv pip install --system -r /tmp/requirements.txt",
        ]
    lines += [
        "COPY remote_runner.py /app/remote_runner.py",
        "WORKDIR /app",
        "ENV KERAS_BACKEND=jax",
        'CMD ["python3"]',
    ]
    return "\n".join(lines) + "\n"


def check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise ImageConfigError(
            f"accelerator category {category!r}: allowed values are {', '.join(CATEGORIES)}"
        )
    return category


def check_arch(category: str, arch: str, accelerator: str | None = None) -> str:
    """``arch`` if an image of ``category`` can be built for it, else an error naming the
    accelerator, the architecture and what is allowed."""
    allowed = CATEGORY_ARCHES[check_category(category)]
    if arch not in allowed:
        what = f"accelerator {accelerator!r}" if accelerator else f"a {category} accelerator"
        raise ImageConfigError(
            f"{what} runs on {arch} hosts, but a {category} image can only be built for "
            f"{', '.join(allowed)} (its JAX, {' '.join(JAX_SPECS[category])}, is published "
            f"for those only): allowed host architectures for {category}: {', '.join(allowed)}"
        )
    return arch


def bundled_hash(
    category: str,
    python: str,
    requirements: Requirements,
    dockerfile: str,
    arch: str = DEFAULT_ARCH,
) -> str:
    """SHA-256 over every input of a bundled image (see module docstring).  The
    platform is an input only when it is not amd64, so amd64 tags stay as they were."""
    platform = [] if arch == DEFAULT_ARCH else [f"platform=linux/{arch}"]
    blob = "\n".join(
        [
            f"base_image=python:{python}-slim",
            f"category={category}",
            *platform,
            f"package={wheel.PACKAGE}=={wheel.package_version()}",
            f"package_files={wheel.package_sha256()}",
            "requirements:",
            requirements.text,
            "dockerfile:",
            dockerfile,
        ]
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def check_image_setting(value: Any, where: str) -> str | None:
    """``value`` if it is a usable ``container_image`` (mode or URI), else an error."""
    if value is None or value == "":
        return None
    # A bare word is refused: it is far more likely a misspelt mode than an image.
    if isinstance(value, str) and (
        value in MODES or (_URI.fullmatch(value) and any(c in value for c in "/:"))
    ):
        return value
    raise ImageConfigError(
        f"{where} container_image={value!r}: allowed values are 'bundled', 'prebuilt' "
        "or an image URI with a registry path or tag, such as "
        "'us-docker.pkg.dev/my-project/my-repo/runner:1'"
    )


def registry_target(
    project: str | None,
    location: str | None,
    repository: str | None,
    zone: str | None,
    cluster: str | None,
) -> RegistryTarget:
    """The bundled images' repository: explicit settings, else derived from the
    cluster (kinetic's ``kn-{cluster}`` in the cluster's region)."""
    if not project:
        raise ImageConfigError(
            "a bundled image needs a GCP project for its Artifact Registry repository: "
            "set the connection's 'project', or container_image='prebuilt' / an image URI"
        )
    location = location or (zone.rsplit("-", 1)[0] if zone and zone.count("-") >= 2 else zone)
    if not location:
        raise ImageConfigError(
            "a bundled image needs an Artifact Registry location: set the connection's "
            "'artifact_registry_location' (e.g. 'us-central1') or 'zone'"
        )
    repository = repository or (f"kn-{cluster}" if cluster else "kinetic")
    if not _REPO.fullmatch(repository):
        raise ImageConfigError(
            f"artifact_registry_repository={repository!r}: lowercase letters, digits and "
            "'-', starting with a letter"
        )
    return RegistryTarget(project, location, repository)


#: What debug mode adds to a job's requirements: its runner's server (``runner/debug.py``).
DEBUGGER_REQUIREMENT = "debugpy"
_NAME_RE = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def with_debugger(reqs: Requirements, debug: bool) -> Requirements:
    """``reqs`` plus ``debugpy`` when ``debug`` and no line names it yet: prebuilt images
    install it at start, bundled ones are built with it, a local venv gets it.  A custom
    image is taken as it is (it needs debugpy of its own)."""
    if not debug:
        return reqs
    for line in reqs.installable:
        m = _NAME_RE.match(line)
        if m and normalise_name(m.group(1)) == DEBUGGER_REQUIREMENT:
            return reqs
    return Requirements([*reqs.lines, DEBUGGER_REQUIREMENT], reqs.source)


def plan_image(
    *,
    container_image: str | None,
    requirements: Any,
    entry_file: str | None,
    local: bool,
    config: Any,
    category: str | None = None,
    accelerator: Accelerator | None = None,
    python: str | None = None,
    ceilings: Sequence[str] = (),
    debug: bool = False,
) -> ImagePlan:
    """Resolve the image and requirements of a task's jobs (no I/O beyond reading
    requirement files and this package's files).  Discovery never climbs above
    ``ceilings`` (the DAGs folder).

    ``accelerator``: the parsed ``Accelerator`` (its category and host ``arch``); or
    ``category`` alone, for amd64 hosts.  ``container_image``: the operator's option
    (``None``: the connection's); ``config``: a ``KineticConfig`` (``container_image``,
    ``image``, ``base_image_repo``, ``artifact_registry_*``, ``project``/``zone``/``cluster``).
    ``debug``: debug mode's jobs get ``debugpy`` (:func:`with_debugger`).
    """
    category = accelerator.category if accelerator is not None else category
    if category is None:
        raise TypeError("plan_image needs an accelerator or a category")
    check_category(category)
    explicit = requirements is not None
    if local:  # the job runs on this machine, whatever the accelerator's hosts are
        reqs = resolve_requirements(requirements, entry_file, category, "local", ceilings)
        reqs = with_debugger(reqs, debug and bool(reqs.installable))  # else: this Python's
        return ImagePlan("local", None, category, requirements=reqs)
    arch = accelerator.arch if accelerator is not None else DEFAULT_ARCH
    label = accelerator.canonical if accelerator is not None else None
    platform = {"arch": check_arch(category, arch, label), "accelerator": label}
    setting = check_image_setting(container_image, "operator") or config.container_image
    setting = setting or config.image or "bundled"
    if setting == "prebuilt":
        reqs = resolve_requirements(requirements, entry_file, category, "prebuilt", ceilings)
        reqs = with_debugger(reqs, debug)
        repo = (config.base_image_repo or "").rstrip("/")
        if not repo:
            raise ImageConfigError(
                "container_image='prebuilt' needs the connection's 'base_image_repo' "
                "(e.g. 'us-docker.pkg.dev/my-project/kinetic'), where "
                "base-cpu/base-gpu/base-tpu images are published (docs/RUNTIME_IMAGES.md)"
            )
        tag = wheel.package_version()
        uri = f"{repo}/base-{category}:{tag}"
        return ImagePlan(
            "prebuilt", uri, category, tag, None, reqs, bool(reqs.installable), **platform
        )
    if setting == "bundled":
        reqs = resolve_requirements(requirements, entry_file, category, "bundled", ceilings)
        reqs = with_debugger(reqs, debug)
        target = registry_target(
            config.project,
            config.artifact_registry_location,
            config.artifact_registry_repository,
            config.zone,
            config.cluster,
        )
        py = python or python_minor()
        dockerfile = render_dockerfile(category, py, with_requirements=True)
        digest = bundled_hash(category, py, reqs, dockerfile, arch)[:12]
        tag = f"{category}-{digest}" if arch == DEFAULT_ARCH else f"{category}-{arch}-{digest}"
        return ImagePlan(
            "bundled",
            f"{target.image}:{tag}",
            category,
            tag,
            dockerfile,
            reqs,
            registry=target,
            **platform,
        )
    # A custom image is taken to be complete; requirements given explicitly are
    # installed at start (discovered ones are not: the image was built for this).
    reqs = resolve_requirements(requirements if explicit else [], entry_file, category, "custom")
    return ImagePlan(
        "custom",
        setting,
        category,
        requirements=reqs,
        needs_requirements_upload=bool(reqs.installable),
        **platform,
    )
