"""``airflow kinetic accelerators``: the accelerator catalog jobs may ask for.

Read from ``core.accelerators`` alone (no connection, store or backend), so the
command works without any Kinetic connection configured.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.cli.common import command, output_format
from airflow_provider_kinetic.cli.output import emit
from airflow_provider_kinetic.core.accelerators import GPU_TYPES, TPU_TYPES


@command
def accelerators(args: Namespace) -> None:
    """The accelerator catalog jobs may ask for (names, sizes, GKE labels)."""
    rows: list[dict[str, Any]] = []
    for gpu in GPU_TYPES.values():
        rows.append(
            {
                "kind": "gpu",
                "name": gpu.name,
                "gke": gpu.gke_label,
                "sizes": "/".join(str(n) for n in gpu.counts),
                "example": f"{gpu.name}x{max(gpu.counts)}" if len(gpu.counts) > 1 else gpu.name,
                "machine_types": {str(n): m for n, m in gpu.counts.items()},
            }
        )
    for tpu in TPU_TYPES.values():
        rows.append(
            {
                "kind": "tpu",
                "name": tpu.name,
                "gke": tpu.gke_accelerator,
                "sizes": "/".join(str(n) for n in tpu.slices),
                "example": f"{tpu.name}-{tpu.default_chips}",
                "topologies": {str(n): s.topology for n, s in tpu.slices.items()},
                "hosts": {str(n): s.num_nodes for n, s in tpu.slices.items()},
            }
        )
    emit(rows, output_format(args), ("kind", "name", "gke", "sizes", "example"))
