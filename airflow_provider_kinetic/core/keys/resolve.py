"""The key store's side of ``kinetic://`` Data (``core/data/schemes/kinetic.py``).

Installed into the scheme when this module is imported; the job packer imports it,
so every submit resolves keys.  A key resolves to a version whose content is still
in the data cache (its completion marker is there): a version collected by
``data gc`` fails here, before anything is uploaded or launched, not in the pod.
"""

from __future__ import annotations

from airflow_provider_kinetic.core.data.refs import marker_key
from airflow_provider_kinetic.core.data.schemes.kinetic import KeyTarget, KineticKeyScheme
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNotFound, parse_ref
from airflow_provider_kinetic.core.storage import ObjectStore


class StoreKeyResolver:
    """``kinetic://KEY[@VERSION]`` against the job's store."""

    def check(self, ref: str) -> None:
        parse_ref(ref)  # KeyNameError (a ValueError) names the value and the form

    def target(self, store: ObjectStore, ref: str) -> KeyTarget:
        _, version = KeyStore(store).resolve(ref)
        key = ref.partition("@")[0]
        if not store.exists(marker_key(version.version)):
            raise KeyNotFound(
                f"Data('kinetic://{ref}'): version {version.version[:12]} of key {key!r} is "
                f"no longer in {store.uri()} (collected by data gc?); put it again"
            )
        return KeyTarget(
            key=key,
            version=version.version,
            is_dir=version.kind == "dir",
            name=version.name,
            empty_dirs=list(version.empty_dirs),
        )


KineticKeyScheme.install(StoreKeyResolver())
