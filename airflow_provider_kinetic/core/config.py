"""Where jobs go: a target's settings, checked, and the store and backend they name.

The hook turns a ``kinetic`` connection (or its absence) into a ``KineticConfig``;
core code and tests build one directly.  What a backend kind needs and where its
store lives is asked of the backend registry, not decided here.

A config is checked when it is made, before anything is uploaded: the backend kind
and its required settings (the registry), the bucket name when the store is GCS
(:func:`~airflow_provider_kinetic.core.settings.check_bucket_name`), and the root
directory when the store is local (``prepare_local_root``: created when missing,
refused when it cannot be written).  The plain fields live in ``core/settings.py``,
below the backends that read them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends import registry
from airflow_provider_kinetic.core.catalog.accelerators import Accelerator, parse_accelerator
from airflow_provider_kinetic.core.runtime.images import check_image_setting
from airflow_provider_kinetic.core.settings import (
    BUCKET_RULES,
    KineticConfigError,
    KineticSettings,
    bucket_name_problem,
    check_bucket_name,
    prepare_local_root,
)
from airflow_provider_kinetic.core.storage import ObjectStore

__all__ = [
    "BUCKET_RULES",
    "KineticConfig",
    "KineticConfigError",
    "bucket_name_problem",
    "check_bucket_name",
    "prepare_local_root",
]


#: False while ``KineticConfig.rebuilt`` makes a config (per thread and task).
_CHECKED: ContextVar[bool] = ContextVar("kinetic_config_checked", default=True)


@dataclass
class KineticConfig(KineticSettings):
    """Settings of one kinetic target (a connection's extras), checked when made."""

    def __post_init__(self) -> None:
        if not _CHECKED.get():  # ``rebuilt``: checked when it was first made
            return
        self._check_images()
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

    def backend_kind(self, accelerator: Accelerator | str | None) -> str:
        """The concrete backend for a job (``auto`` resolved by preflight); given the
        accelerator string as written, a backend may read it too (the local one lets
        a bare ``gpu:N`` take any GPU model the machine has).

        Raises before anything is uploaded when the choice cannot run the job.
        """
        if isinstance(accelerator, str):
            return registry.resolve_kind(self.backend, parse_accelerator(accelerator), accelerator)
        return registry.resolve_kind(self.backend, accelerator)

    def store(self) -> ObjectStore:
        return registry.backend_class(registry.store_kind(self.backend)).store_for(self)
