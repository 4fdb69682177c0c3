"""Where jobs go: one target's settings (a ``kinetic`` connection's extras), checked
when made, and the store and backend they name.

The hook turns a ``kinetic`` connection (or its absence) into a :class:`KineticConfig`;
core code and tests build one directly.  What a backend kind needs and where its store
lives is asked of the backend registry, not decided here.

A config is checked when it is made, before anything is uploaded: the image settings,
the backend kind and its required settings (the registry), the bucket name when the
store is GCS (:func:`check_bucket_name`), and the root directory when the store is
local (:func:`prepare_local_root`: created when missing, refused when it cannot be
written).  Backends read a config's fields; they name the class for type checkers only,
so they sit below this module at run time.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import tempfile
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.catalog.accelerators import Accelerator, parse_accelerator
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.runtime.images import check_image_setting
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.local import TMP_SUFFIX

__all__ = [
    "BUCKET_RULES",
    "KineticConfig",
    "KineticConfigError",
    "bucket_name_problem",
    "check_bucket_name",
    "prepare_local_root",
]


class KineticConfigError(KineticError, ValueError):
    """A kinetic target is misconfigured; the message names the value and what is allowed."""


#: What a GCS bucket name may be (https://cloud.google.com/storage/docs/buckets#naming).
BUCKET_RULES = (
    "bucket names have 3-63 characters (up to 222 with dots, at most 63 between dots): "
    "lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or "
    "digit; they do not start with 'goog', do not contain 'google' and are not IP addresses"
)
_BUCKET_CHARS = re.compile(r"[a-z0-9._-]+")


def bucket_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid GCS bucket name, or ``None`` when it is."""
    if not isinstance(name, str) or not name:
        return "it is empty"
    if name.startswith("gs://"):
        return f"give the bare name {name[5:].split('/')[0]!r}, without 'gs://'"
    if name != name.lower() and _BUCKET_CHARS.fullmatch(name.lower()):
        return "uppercase letters are not allowed"
    bad = sorted({c for c in name if not _BUCKET_CHARS.fullmatch(c)})
    if bad:
        return f"it contains {', '.join(repr(c) for c in bad)}"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return "it must start and end with a letter or digit"
    if "." in name:
        if len(name) > 222:
            return f"it has {len(name)} characters (at most 222 with dots)"
        long = [part for part in name.split(".") if len(part) > 63]
        if long:
            return f"the part {long[0][:20]!r}... has {len(long[0])} characters (at most 63)"
        if not all(name.split(".")):
            return "it has an empty part between dots"
    elif len(name) > 63:
        return f"it has {len(name)} characters (at most 63)"
    if len(name) < 3:
        return f"it has {len(name)} characters (at least 3)"
    if name.startswith("goog"):
        return "it starts with 'goog'"
    if "google" in name:
        return "it contains 'google'"
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name)
        return "it is an IP address"
    return None


def check_bucket_name(name: str, source: str = "bucket") -> str:
    """``name`` if it is a valid GCS bucket name; else :class:`KineticConfigError`."""
    problem = bucket_name_problem(name)
    if problem:
        raise KineticConfigError(
            f"invalid GCS bucket name {name!r} ({source}): {problem}; {BUCKET_RULES}"
        )
    return name


def prepare_local_root(path: str) -> str:
    """The local store root, absolute; created when missing, checked to be writable.

    A root that exists but cannot be written, or that cannot be created (a parent
    that is a file, or not writable), is a :class:`KineticConfigError` naming it.
    """
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(root):
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            blocker = _existing_ancestor(root)
            raise KineticConfigError(
                f"local store root {root!r} does not exist and cannot be created: "
                f"{exc.strerror or exc} (in {blocker!r}); set 'root' to a directory "
                "this machine can write, or create it"
            ) from None
    if not os.path.isdir(root):
        raise KineticConfigError(
            f"local store root {root!r} is not a directory; set 'root' to a directory"
        )
    try:  # a real write: permissions, read-only mounts and root's privileges all count
        # (named like the store's in-flight files, which listings skip)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe-", suffix=TMP_SUFFIX)
    except OSError as exc:
        raise KineticConfigError(
            f"local store root {root!r} is not writable ({exc.strerror or exc}); "
            "set 'root' to a directory this machine can write"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return root


def _existing_ancestor(path: str) -> str:
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    return parent


#: False while ``KineticConfig.rebuilt`` makes a config (per thread and task).
_CHECKED: ContextVar[bool] = ContextVar("kinetic_config_checked", default=True)


@dataclass
class KineticConfig:
    """Settings of one kinetic target (a connection's extras), checked when made."""

    backend: str = "local"
    bucket: str | None = None
    root: str | None = None
    project: str | None = None
    zone: str | None = None
    cluster: str | None = None
    namespace: str = "default"
    #: A custom image URI (older spelling of ``container_image=<URI>``).
    image: str | None = None
    #: ``bundled`` | ``prebuilt`` | an image URI (``core/runtime/images.py``); unset:
    #: ``image`` if set, else ``bundled`` on a cluster backend.
    container_image: str | None = None
    #: Where ``prebuilt`` images live: ``{base_image_repo}/base-{category}:{version}``.
    base_image_repo: str | None = None
    #: Bundled images' Artifact Registry repository (defaults: the zone's region, and
    #: ``kn-{cluster}``); the project is ``project``.
    artifact_registry_location: str | None = None
    artifact_registry_repository: str | None = None
    service_account: str = "kinetic"
    runner_command: list[str] | None = None
    gcp_conn_id: str = "google_cloud_default"
    impersonation_chain: str | list[str] | None = None
    #: {"host", "ca_data"} of the cluster's API server, once discovered (or given).
    endpoint: dict[str, Any] | None = None
    use_internal_ip: bool = False
    use_dns_endpoint: bool = False
    image_pull_grace_s: float = 300.0
    schedule_timeout_s: float | None = 1800.0
    create_grace_s: float = 180.0
    #: Backstop TTL of a finished Job (it is deleted as soon as its result is collected).
    ttl_seconds_after_finished: int = 600
    #: Default ``capacity=`` of tasks that give none (``core.capacity``): one kind or a
    #: list of steps; None: on-demand.
    capacity: str | list[str] | None = None
    #: How local Data is stored: ``files`` (per-file objects and a manifest: uploads
    #: and store growth follow what changed) or ``kinetic`` (kinetic 0.0.4's per-tree
    #: entries, for jobs run by kinetic's own runner on a bucket).
    data_layout: str = "files"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _CHECKED.get():  # ``rebuilt``: checked when it was first made
            return
        self._check_images()
        if self.data_layout not in ("files", "kinetic"):
            raise KineticConfigError(
                f"data_layout={self.data_layout!r} is not one of 'files' (incremental, the "
                "default) or 'kinetic' (kinetic 0.0.4's per-tree entries)"
            )
        # Raises for an unknown kind, listing the registered ones.
        cls = registry.backend_class(registry.store_kind(self.backend))
        cls.validate_config(self)
        # Building a store is cheap (no client, no credentials): its scheme says what to check.
        store = cls.store_for(self)
        if store.scheme == "gs":
            source = (
                "the 'bucket' setting"
                if self.bucket == store.bucket
                else f"the bucket the {cls.name} backend derives from the connection; "
                "set 'bucket' to choose one"
            )
            check_bucket_name(store.bucket, source)
        elif store.scheme == "file":
            prepare_local_root(store.bucket)

    @classmethod
    def rebuilt(cls, values: dict[str, Any]) -> KineticConfig:
        """A config checked when it was made, rebuilt from its dict (trigger kwargs)
        without checking it again: checking a local root creates it when missing, and
        a poll must never create a store root that went away (an unmounted store
        would come back empty, every job in it NOT_FOUND)."""
        token = _CHECKED.set(False)
        try:
            return cls(**values)
        finally:
            _CHECKED.reset(token)

    def _check_images(self) -> None:
        """Image settings are checked here, before anything is planned or uploaded."""
        check_image_setting(self.container_image, "connection")
        if self.image:
            check_image_setting(self.image, "connection 'image':")
            if self.image in ("bundled", "prebuilt"):
                raise KineticConfigError(
                    f"image={self.image!r} is an image URI setting; write "
                    f"container_image={self.image!r} for the {self.image} mode"
                )
        if self.image and self.container_image and self.image != self.container_image:
            raise KineticConfigError(
                f"both image={self.image!r} and container_image={self.container_image!r} "
                "are set; keep container_image ('image' is its older spelling for a URI)"
            )

    @property
    def bucket_name(self) -> str:
        """The store root: a bucket, or the local backend's directory."""
        return registry.backend_class(registry.store_kind(self.backend)).bucket_for(self)

    def backend_kind(self, accelerator: Accelerator | str | None, num_slices: int = 1) -> str:
        """The concrete backend for a job (``auto`` resolved by preflight); given the
        accelerator string as written, a backend may read it too (the local one lets
        a bare ``gpu:N`` take any GPU model the machine has).

        More than one slice (``num_slices``) needs a backend that runs a multi-slice job
        (``auto``: the JobSet one).  Raises before anything is uploaded when the choice
        cannot run the job.
        """
        if isinstance(accelerator, str):
            return registry.resolve_kind(
                self.backend, parse_accelerator(accelerator), accelerator, num_slices
            )
        return registry.resolve_kind(self.backend, accelerator, num_slices=num_slices)

    def store(self) -> ObjectStore:
        store = registry.backend_class(registry.store_kind(self.backend)).store_for(self)
        store.data_layout = self.data_layout
        return store

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
