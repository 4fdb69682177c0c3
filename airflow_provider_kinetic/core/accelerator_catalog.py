"""The accelerator catalog as data: every GPU and TPU kinetic can schedule.

GPU models with their machine type per count, TPU generations with their slice
shapes, the names users may use for them and the "most capable first" orders.
Kept apart from the parser (``accelerators.py``, the layer above) so the tables
read on their own; stdlib-only on purpose, because the pod runner imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuType:
    """A GPU model: its GKE node label and the machine type for each count."""

    name: str
    gke_label: str
    counts: dict[int, str]


@dataclass(frozen=True)
class TpuSlice:
    """One provisionable slice shape of a TPU generation."""

    chips: int
    topology: str
    machine_type: str
    num_nodes: int


@dataclass(frozen=True)
class TpuType:
    """A TPU generation: its GKE accelerator name and its slice shapes by chip count."""

    name: str
    gke_accelerator: str
    default_chips: int
    slices: dict[int, TpuSlice]


# The catalog is kept as text tables so it reads like the GKE docs it was checked
# against (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus) and
# can be compared with kinetic's numbers at a glance.  Tests pin every row.

# name, GKE node label, then count:machine-type pairs; order = kinetic's order.
_GPU_TABLE = """
l4        nvidia-l4          1:g2-standard-4 2:g2-standard-24 4:g2-standard-48 8:g2-standard-96
t4        nvidia-tesla-t4    1:n1-standard-4 2:n1-standard-8 4:n1-standard-16
v100      nvidia-tesla-v100  1:n1-standard-8 2:n1-standard-16 4:n1-standard-32 8:n1-standard-64
a100      nvidia-tesla-a100  1:a2-highgpu-1g 2:a2-highgpu-2g 4:a2-highgpu-4g 8:a2-highgpu-8g
                             16:a2-megagpu-16g
a100-80gb nvidia-a100-80gb   1:a2-ultragpu-1g 2:a2-ultragpu-2g 4:a2-ultragpu-4g 8:a2-ultragpu-8g
                             16:a2-ultragpu-16g
h100      nvidia-h100-80gb   1:a3-highgpu-1g 2:a3-highgpu-2g 4:a3-highgpu-4g 8:a3-highgpu-8g
p4        nvidia-tesla-p4    1:n1-standard-4 2:n1-standard-8 4:n1-standard-16
p100      nvidia-tesla-p100  1:n1-standard-4 2:n1-standard-8 4:n1-standard-16
"""

# "tpu NAME GKE-ACCELERATOR DEFAULT-CHIPS" headers, then shapes "CHIPS TOPOLOGY MACHINE HOSTS",
# two shapes per line.
_TPU_TABLE = """
tpu v3 tpu-v3-podslice 4
    4     2x2       ct3-hightpu-4t    1        16    4x4       ct3p-hightpu-4t   4
    32    4x8       ct3p-hightpu-4t   8        64    8x8       ct3p-hightpu-4t   16
    128   8x16      ct3p-hightpu-4t   32       256   16x16     ct3p-hightpu-4t   64
    512   16x32     ct3p-hightpu-4t   128      1024  32x32     ct3p-hightpu-4t   256
    2048  32x64     ct3p-hightpu-4t   512
tpu v4 tpu-v4-podslice 4
    4     2x2x1     ct4p-hightpu-4t   1        8     2x2x2     ct4p-hightpu-4t   2
    16    2x2x4     ct4p-hightpu-4t   4        32    2x4x4     ct4p-hightpu-4t   8
    64    4x4x4     ct4p-hightpu-4t   16       128   4x4x8     ct4p-hightpu-4t   32
    256   4x8x8     ct4p-hightpu-4t   64       512   8x8x8     ct4p-hightpu-4t   128
    1024  8x8x16    ct4p-hightpu-4t   256      2048  8x16x16   ct4p-hightpu-4t   512
    4096  16x16x16  ct4p-hightpu-4t   1024
tpu v5litepod tpu-v5-lite-podslice 4
    1     1x1       ct5lp-hightpu-1t  1        4     2x2       ct5lp-hightpu-4t  1
    8     2x4       ct5lp-hightpu-8t  1        16    4x4       ct5lp-hightpu-4t  4
    32    4x8       ct5lp-hightpu-4t  8        64    8x8       ct5lp-hightpu-4t  16
    128   8x16      ct5lp-hightpu-4t  32       256   16x16     ct5lp-hightpu-4t  64
tpu v5p tpu-v5p-slice 8
    8     2x2x2     ct5p-hightpu-4t   2        16    2x2x4     ct5p-hightpu-4t   4
    32    2x4x4     ct5p-hightpu-4t   8
tpu v6e tpu-v6e-slice 8
    8     2x4       ct6e-standard-4t  2        16    4x4       ct6e-standard-4t  4
"""


def _load_gpus(table: str) -> dict[str, GpuType]:
    gpus: dict[str, GpuType] = {}
    name = ""
    for line in table.strip().splitlines():
        words = line.split()
        if not line[0].isspace():  # a new GPU; continuation lines only add counts
            name, label, words = words[0], words[1], words[2:]
            gpus[name] = GpuType(name=name, gke_label=label, counts={})
        for pair in words:
            count, machine = pair.split(":")
            gpus[name].counts[int(count)] = machine
    return gpus


def _load_tpus(table: str) -> dict[str, TpuType]:
    tpus: dict[str, TpuType] = {}
    current: TpuType | None = None
    for words in (line.split() for line in table.strip().splitlines()):
        if words[0] == "tpu":
            current = TpuType(words[1], words[2], int(words[3]), slices={})
            tpus[current.name] = current
            continue
        assert current is not None, "TPU table row before any 'tpu' header"
        for i in range(0, len(words), 4):
            chips, topology, machine, hosts = words[i : i + 4]
            current.slices[int(chips)] = TpuSlice(int(chips), topology, machine, int(hosts))
    return tpus


#: GPU catalog: name -> type with its count -> machine-type map.
GPU_TYPES: dict[str, GpuType] = _load_gpus(_GPU_TABLE)
#: TPU catalog: name -> type with its chips -> slice map (``num_nodes`` = VMs).
TPU_TYPES: dict[str, TpuType] = _load_tpus(_TPU_TABLE)


# Users copy GKE node labels out of `kubectl get nodes`, so accept them as names.
GPU_ALIASES: dict[str, str] = {g.gke_label: g.name for g in GPU_TYPES.values()}
TPU_ALIASES: dict[str, str] = {"v5e": "v5litepod"}

# "gpu:N" / "tpu:N" pick the most capable hardware that has an N-sized shape.
GPU_PREFERENCE = ("h100", "a100-80gb", "a100", "l4", "v100", "t4", "p100", "p4")
TPU_PREFERENCE = ("v6e", "v5p", "v5litepod", "v4", "v3")

# Cloud TPU names v3 slices by TensorCores (two per chip): "v3-8" is the 4-chip
# 2x2 slice.  kinetic's catalog is indexed by chips, so "v3-8" only resolves via
# this fallback, used solely when N is not itself a valid chip count.
CORES_PER_CHIP_NAMING: dict[str, int] = {"v3": 2}


def describe_catalog() -> str:
    """One-paragraph listing of known GPU/TPU names and their valid sizes, for messages."""
    gpus = ", ".join(f"{g.name} x{_join(g.counts)}" for g in GPU_TYPES.values())
    tpus = ", ".join(f"{t.name} ({_join(t.slices)} chips)" for t in TPU_TYPES.values())
    return f"Known GPUs: {gpus}. Known TPUs: {tpus}; 'v5e' means v5litepod."


def _join(numbers: dict[int, object]) -> str:
    return "/".join(str(n) for n in numbers)
