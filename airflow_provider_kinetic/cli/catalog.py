"""``airflow kinetic accelerators``: the accelerator catalog jobs may ask for.

Read from ``core.accelerators`` (and ``core.capacity`` for the capacity kinds GKE
offers each shape) alone: no connection, store or backend, so the command works
without any Kinetic connection configured.

One row per GPU model or TPU generation: every spelling the parser accepts for it
(its name, aliases and GKE label), the hosts' CPU architecture, and per size the
hosts per slice, chips per host and capacity kinds.  ``-o json`` has the same per
size as objects keyed by the size (machine types and TPU topologies too).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from airflow_provider_kinetic.cli.common import command, output_format
from airflow_provider_kinetic.cli.output import emit
from airflow_provider_kinetic.core.catalog.accelerators import (
    GPU_TYPES,
    TPU_TYPES,
    Accelerator,
    parse_accelerator,
)
from airflow_provider_kinetic.core.catalog.capacity import CAPACITY_KINDS, supported_kinds
from airflow_provider_kinetic.core.catalog.hardware import gpu_spellings, tpu_spellings

COLUMNS = (
    "kind",
    "name",
    "aliases",
    "arch",
    "sizes",
    "hosts",
    "chips_per_host",
    "capacity",
    "example",
)


@command
def accelerators(args: Namespace) -> None:
    """The accelerator catalog jobs may ask for: spellings, sizes, hosts, capacity."""
    rows: list[dict[str, Any]] = []
    for gpu in GPU_TYPES.values():
        shapes = {n: parse_accelerator(f"gpu:{gpu.name}x{n}") for n in gpu.counts}
        example = f"gpu-{gpu.name}x{max(gpu.counts)}"
        rows.append(
            _row("gpu", gpu.name, gpu_spellings(gpu), gpu.gke_label, gpu.arch, shapes, example)
            | {"machine_types": {str(n): m for n, m in gpu.counts.items()}}
        )
    for tpu in TPU_TYPES.values():
        shapes = {
            c: parse_accelerator(f"tpu:{tpu.name}-{s.topology}") for c, s in tpu.slices.items()
        }
        example = f"tpu-{tpu.name}-{tpu.slices[tpu.default_chips].topology}"
        rows.append(
            _row(
                "tpu", tpu.name, tpu_spellings(tpu), tpu.gke_accelerator, tpu.arch, shapes, example
            )
            | {
                "machine_types": {str(n): s.machine_type for n, s in tpu.slices.items()},
                "topologies": {str(n): s.topology for n, s in tpu.slices.items()},
            }
        )
    output = output_format(args)
    if output == "table":
        rows = [{c: _cell(row[c]) for c in COLUMNS} for row in rows]
    emit(rows, output, COLUMNS)


def _row(
    kind: str,
    name: str,
    spellings: list[str],
    gke: str,
    arch: str,
    shapes: dict[int, Accelerator],
    example: str,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "aliases": spellings[1:],
        "spellings": spellings,
        "gke": gke,
        "arch": arch,
        "sizes": "/".join(str(n) for n in shapes),
        "hosts": {str(n): a.num_nodes for n, a in shapes.items()},
        "chips_per_host": {str(n): a.chips_per_host for n, a in shapes.items()},
        "capacity": {str(n): list(supported_kinds(a)) for n, a in shapes.items()},
        "example": example,
    }


def _cell(value: Any) -> str:
    """A table cell: lists joined; per-size values in the order of ``sizes``; capacity
    kinds that only some sizes have, with those sizes in brackets."""
    if isinstance(value, list):
        return ", ".join(value)
    if not isinstance(value, dict):
        return str(value)
    if not all(isinstance(v, list) for v in value.values()):
        return "/".join(str(v) for v in value.values())
    parts = []
    for kind in CAPACITY_KINDS:
        sizes = [size for size, kinds in value.items() if kind in kinds]
        if sizes:
            parts.append(kind if len(sizes) == len(value) else f"{kind} ({'/'.join(sizes)})")
    return ", ".join(parts)
