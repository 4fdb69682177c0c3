"""One remote call as the operator (or plain Python) describes it, and the checks on it.

A :class:`JobRequest` holds every option a task gives (how and where it runs as one
:class:`~airflow_provider_kinetic.core.jobs.options.JobOptions`); everything here runs before
anything is packed or uploaded: which environment variables travel
(:func:`capture_env`), whether volumes and Data are usable, and which image the job
needs (:func:`plan_for_request`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.backends.registry import backend_class
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.mounts import FUSE_ROOT, check_mount_paths
from airflow_provider_kinetic.core.jobs.byvalue import underlying
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.resultcache import CacheSettings
from airflow_provider_kinetic.core.runtime.images import ImagePlan, plan_image

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
    #: How and where the job runs (accelerator, resources, labels, capacity, checkpoints).
    options: JobOptions = field(default_factory=JobOptions)
    volumes: dict[str, Data] | None = None
    capture_env_vars: list[str] | None = None
    output_dir: str | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    by_value_roots: list[str] = field(default_factory=list)
    job_id: str | None = None
    #: The DAG file: its project directory becomes the job context (``core.runtime.context``);
    #: None (plain Python without a DAG) sends a plan-only context.
    entry_file: str | None = None
    #: Extra glob patterns left out of the context (as lines of ``.kineticignore``).
    context_excludes: list[str] = field(default_factory=list)
    #: Size cap of the context in MB (``[kinetic] max_context_mb``); None: the default.
    max_context_mb: float | None = None
    #: Size cap of the pickled call in MB (``[kinetic] max_payload_mb``); None: the
    #: default (``core.jobs.pack.DEFAULT_MAX_PAYLOAD_MB``), 0: no cap.
    max_payload_mb: float | None = None
    #: ``bundled`` | ``prebuilt`` | an image URI; None: the connection's (core.runtime.images).
    container_image: str | None = None
    #: Requirement lines or a file path; None: discovered next to ``entry_file``.
    requirements: list[str] | str | None = None
    #: The image plan the operator already resolved (and built); None: resolved here.
    image_plan: ImagePlan | None = None
    #: ``cache=True``: the reuse key is computed (``core.jobs.resultcache``); None: off.
    cache: CacheSettings | None = None

    def __post_init__(self) -> None:
        # One name is a list of one (a templated "{{ var.value.key_name }}" renders to a
        # string); iterating a string would forward single characters.
        self.capture_env_vars = names_option(self.capture_env_vars, "capture_env_vars") or None
        if not isinstance(self.options, JobOptions):
            raise TypeError(f"options must be a JobOptions(...), got {self.options!r}")

    @property
    def func_name(self) -> str:
        """The user's function's name (a partial's or bound method's too, not "partial")."""
        return getattr(underlying(self.func), "__name__", type(self.func).__name__)


def names_option(value: Any, option: str) -> list[str]:
    """A list-of-names option as a list: one name (a string) is a list of one, never a
    sequence of characters; anything else but a list of names fails naming ``option``."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple | set | frozenset):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    raise TypeError(
        f"{option} must be a name or a list of names, got {type(value).__name__}: {value!r}"
    )


def capture_env(patterns: Any, environ: dict[str, str] | None = None) -> dict[str, str]:
    """kinetic's capture rules: exact names, ``PREFIX*`` patterns, ``*`` for all.

    ``patterns``: one name, or a list of names and patterns.  Wildcards skip the
    blocklist unless the name is also listed exactly.
    """
    patterns = names_option(patterns, "capture_env_vars")
    environ = dict(os.environ if environ is None else environ)
    out: dict[str, str] = {}
    exact = {p for p in patterns if isinstance(p, str) and not p.endswith("*")}
    for pattern in patterns:
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
    """Mount paths safe (``core.data.mounts``) and values Data; raises naming the bad entry."""
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


def plan_for_request(request: JobRequest, config: Any, kind: str) -> ImagePlan:
    """The image plan of a request on backend ``kind``: the one the operator resolved
    (``request.image_plan``), else resolved now.  Backends that run no containers
    (local) get ``mode="local"``."""
    if request.image_plan is not None:
        return request.image_plan
    return plan_image(
        container_image=request.container_image,
        requirements=request.requirements,
        entry_file=request.entry_file,
        accelerator=parse_accelerator(request.options.accelerator),
        local=not backend_class(kind).needs_cluster,
        config=config,
        ceilings=request.by_value_roots or (),
        debug=request.options.debug_port is not None,
    )
