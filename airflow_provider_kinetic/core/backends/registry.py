"""The backend registry: ``{kind: class}``, the only place backend kinds are listed.

Config validation, the hook, dry runs, links and the connection form ask this
module (and the classes it returns) instead of comparing kind strings.  Classes are
registered by import path so that listing kinds (the connection form, provider
info) imports neither ``kubernetes`` nor the backends themselves.

Adding a backend: write a :class:`~airflow_provider_kinetic.core.backends.base.Backend`
subclass and call :func:`register_backend` (built-ins are registered below).
"""

from __future__ import annotations

import importlib

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator

#: A :class:`~airflow_provider_kinetic.core.backends.base.Backend` subclass.  The
#: registry names backends by import path and imports none of them, not even for the
#: type checker: the backends read a ``KineticConfig``, which asks this registry.
BackendClass = type

#: The pseudo-kind that picks the first auto candidate whose preflight passes.
AUTO = "auto"
#: The kind ``auto`` picks for a job of more than one TPU slice (one JobSet).
MULTI_SLICE = "jobset"

_REGISTRY: dict[str, str | BackendClass] = {}


def register_backend(kind: str, target: str | BackendClass) -> None:
    """Register ``target`` (a class or ``"module:Class"``) as backend ``kind``."""
    if kind == AUTO or not kind.isidentifier():
        raise ValueError(f"invalid backend kind {kind!r}")
    _REGISTRY[kind] = target


def backend_kinds(*, with_auto: bool = True) -> tuple[str, ...]:
    """Every registered kind (and ``auto``), in registration order."""
    return (*_REGISTRY, AUTO) if with_auto else tuple(_REGISTRY)


def backend_class(kind: str) -> BackendClass:
    """The class registered for ``kind``; the error lists the kinds there are."""
    try:
        target = _REGISTRY[kind]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown kinetic backend {kind!r}; allowed: {', '.join(backend_kinds())}"
        ) from None
    if isinstance(target, str):
        module, _, name = target.partition(":")
        try:
            target = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            raise ImportError(
                f"the {kind!r} backend needs packages that are not installed ({exc}); "
                "install airflow-provider-kinetic[gke]"
            ) from exc
        _REGISTRY[kind] = target
    return target


def auto_candidates() -> list[BackendClass]:
    """Classes ``auto`` may choose, in registration order."""
    return [cls for cls in map(backend_class, list(_REGISTRY)) if cls.auto_candidate]


def resolve_kind(
    configured: str,
    accelerator: Accelerator | None,
    requested: str | None = None,
    num_slices: int = 1,
) -> str:
    """The concrete kind that runs a job on ``accelerator`` (``num_slices`` of it).

    ``auto`` picks the first candidate whose preflight accepts the accelerator, or
    :data:`MULTI_SLICE` for more than one slice; an explicit kind must accept it.
    Raises before anything is uploaded.
    """
    if num_slices > 1:
        cls = backend_class(MULTI_SLICE if configured == AUTO else configured)
        if not getattr(cls, "runs_slices", False):
            raise ValueError(
                f"num_slices={num_slices} needs backend {MULTI_SLICE!r} or {AUTO!r}; "
                f"backend {configured!r} runs one slice"
            )
        if accelerator is not None:
            cls.preflight(accelerator, requested)
        return cls.name
    if configured == AUTO:
        reasons = []
        for cls in auto_candidates():
            try:
                if accelerator is not None:
                    cls.preflight(accelerator, requested)
            except ValueError as exc:
                reasons.append(f"{cls.name}: {exc}")
                continue
            return cls.name
        raise ValueError("no backend can run this job: " + "; ".join(reasons))
    cls = backend_class(configured)
    if accelerator is not None:
        cls.preflight(accelerator, requested)
    return cls.name


def store_kind(configured: str) -> str:
    """The kind whose store a target uses (``auto``: its first candidate's)."""
    if configured != AUTO:
        return backend_class(configured).name
    return auto_candidates()[0].name


register_backend("local", "airflow_provider_kinetic.core.backends.local.backend:LocalBackend")
register_backend("gke", "airflow_provider_kinetic.core.backends.k8s.gke:GkeBackend")
register_backend("pathways", "airflow_provider_kinetic.core.backends.k8s.pathways:PathwaysBackend")
register_backend(MULTI_SLICE, "airflow_provider_kinetic.core.backends.k8s.jobset:JobSetBackend")
