"""``hf://org/name?split=&config_name=&revision=``: a Hugging Face dataset.

Passed through by reference (always a directory, never FUSE); the runner loads it
with ``datasets.load_dataset`` into a temporary cache and ``save_to_disk`` at the
target path, so the function receives a directory ``datasets.load_from_disk`` reads.
``datasets`` is needed only in the job's environment, and only when hf:// is used.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.data.schemes.base import Data, DataScheme, plain_ref
from airflow_provider_kinetic.core.storage import ObjectStore


class HfScheme(DataScheme):
    name = "hf"

    def validate(self, data: Data) -> None:
        from airflow_provider_kinetic.core.data.schemes.hf_load import parse_hf_uri

        parse_hf_uri(data.path)
        if data.fuse:
            raise ValueError(f"Data({data.path!r}): fuse=True is not supported for hf:// data")

    def is_dir(self, data: Data) -> bool:
        return True

    def ref(
        self, data: Data, store: ObjectStore, mount: str | None
    ) -> tuple[dict[str, Any], FuseMount | None]:
        return plain_ref(data, data.path, True, mount), None

    def materialise(self, ref: dict[str, Any], target: str) -> str:
        from airflow_provider_kinetic.core.data.schemes.hf_load import load_hf_to_disk

        return load_hf_to_disk(ref["uri"], target, bool(ref.get("hf_trust_remote_code")))
