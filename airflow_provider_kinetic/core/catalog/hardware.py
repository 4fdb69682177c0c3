"""The accelerator catalog as data: every GPU and TPU kinetic can schedule.

GPU models with their machine type per count, TPU generations with their slice
shapes, the host CPU architecture of each, the names users may use for them and the
"most capable first" orders.  Kept apart from the parser (``accelerators.py``, the
layer above) so the tables read on their own; stdlib-only on purpose, because the
pod runner imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Host CPU architectures, as Kubernetes (``kubernetes.io/arch``) and Docker name them.
ARCHES = ("amd64", "arm64")


@dataclass(frozen=True)
class GpuType:
    """A GPU model: its GKE node label, the machine type per count and the hosts' CPU."""

    name: str
    gke_label: str
    counts: dict[int, str]
    arch: str = "amd64"

    def chips_per_host(self, count: int) -> int:
        """GPUs on the one VM of a ``count``-GPU machine type (GPU jobs are one host)."""
        return count


@dataclass(frozen=True)
class TpuSlice:
    """One provisionable slice shape of a TPU generation.

    ``in_kinetic``: the shape is in kinetic 0.0.4's catalog; "tpu:N" prefers those, so
    a count kinetic resolved keeps resolving to the same hardware here.
    """

    chips: int
    topology: str
    machine_type: str
    num_nodes: int
    in_kinetic: bool = True

    @property
    def chips_per_host(self) -> int:
        """TPU chips on each VM of the slice (what each pod requests)."""
        return self.chips // self.num_nodes


@dataclass(frozen=True)
class TpuType:
    """A TPU generation: its GKE accelerator name and its slice shapes by chip count."""

    name: str
    gke_accelerator: str
    default_chips: int
    slices: dict[int, TpuSlice]
    arch: str = "amd64"


# The catalog is kept as text tables so it reads like the GKE docs it was checked
# against and can be compared with kinetic's numbers at a glance.  Tests pin every
# row, and a test walks kinetic 0.0.4's own catalog (tests/integration/core/catalog/
# test_catalog_kinetic.py): every string kinetic accepts lands on the same hardware.

# name, GKE node label (cloud.google.com/gke-accelerator), host arch, then
# count:machine-type pairs.  The first eight rows are kinetic 0.0.4's, in its order.
# Checked against:
#   https://cloud.google.com/kubernetes-engine/docs/concepts/gpus (GKE GPU models)
#   https://docs.cloud.google.com/compute/docs/gpus (models and labels: nvidia-gb200
#     "Grace Blackwell Superchips", nvidia-b200, nvidia-h200-141gb; G4 = RTX PRO 6000)
#   https://docs.cloud.google.com/compute/docs/accelerator-optimized-machines
#     (A4X/A4/A3 Ultra/A3 Mega/A3 High/G4 series)
#   https://docs.cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra
#     (a3-ultragpu-8g = H200, a4-highgpu-8g = B200, a4x-highgpu-4g = GB200)
# GB200 (A4X) hosts are NVIDIA Grace (Arm) CPUs: arm64.
_GPU_TABLE = """
l4           nvidia-l4              amd64  1:g2-standard-4 2:g2-standard-24 4:g2-standard-48
                                           8:g2-standard-96
t4           nvidia-tesla-t4        amd64  1:n1-standard-4 2:n1-standard-8 4:n1-standard-16
v100         nvidia-tesla-v100      amd64  1:n1-standard-8 2:n1-standard-16 4:n1-standard-32
                                           8:n1-standard-64
a100         nvidia-tesla-a100      amd64  1:a2-highgpu-1g 2:a2-highgpu-2g 4:a2-highgpu-4g
                                           8:a2-highgpu-8g 16:a2-megagpu-16g
a100-80gb    nvidia-a100-80gb       amd64  1:a2-ultragpu-1g 2:a2-ultragpu-2g 4:a2-ultragpu-4g
                                           8:a2-ultragpu-8g 16:a2-ultragpu-16g
h100         nvidia-h100-80gb       amd64  1:a3-highgpu-1g 2:a3-highgpu-2g 4:a3-highgpu-4g
                                           8:a3-highgpu-8g
p4           nvidia-tesla-p4        amd64  1:n1-standard-4 2:n1-standard-8 4:n1-standard-16
p100         nvidia-tesla-p100      amd64  1:n1-standard-4 2:n1-standard-8 4:n1-standard-16
h100-mega    nvidia-h100-mega-80gb  amd64  8:a3-megagpu-8g
h200         nvidia-h200-141gb      amd64  8:a3-ultragpu-8g
b200         nvidia-b200            amd64  8:a4-highgpu-8g
gb200        nvidia-gb200           arm64  4:a4x-highgpu-4g
rtx-pro-6000 nvidia-rtx-pro-6000    amd64  1:g4-standard-48 2:g4-standard-96 4:g4-standard-192
                                           8:g4-standard-384
"""

# "tpu NAME GKE-ACCELERATOR DEFAULT-CHIPS ARCH" headers (cloud.google.com/
# gke-tpu-accelerator), then one shape a line: "CHIPS TOPOLOGY MACHINE-TYPE HOSTS";
# hosts = chips / chips-per-VM (the machine type's "-Nt").  "+" before the chips marks
# a shape kinetic 0.0.4 does not have.  Checked against:
#   https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (GKE TPU shapes)
#   https://docs.cloud.google.com/tpu/docs/v5e and .../tpu/docs/supported-versions
#     (v5e 1x1..16x16, ct5lp-hightpu-1t/4t/8t)
#   https://docs.cloud.google.com/tpu/docs/v6e (v6e, Trillium)
#   https://docs.cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra
#     (ct6e-standard-1t/4t/8t, tpu7x-standard-4t)
#   https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood and
#   https://docs.cloud.google.com/tpu/docs/tpu7x (TPU7x: four chips per VM)
# TPU hosts are x86 VMs (and libtpu ships x86-64 wheels only): amd64.
_TPU_TABLE = """
tpu v3 tpu-v3-podslice 4 amd64
     4  2x2       ct3-hightpu-4t     1
    16  4x4       ct3p-hightpu-4t    4
    32  4x8       ct3p-hightpu-4t    8
    64  8x8       ct3p-hightpu-4t   16
   128  8x16      ct3p-hightpu-4t   32
   256  16x16     ct3p-hightpu-4t   64
   512  16x32     ct3p-hightpu-4t  128
  1024  32x32     ct3p-hightpu-4t  256
  2048  32x64     ct3p-hightpu-4t  512
tpu v4 tpu-v4-podslice 4 amd64
     4  2x2x1     ct4p-hightpu-4t    1
     8  2x2x2     ct4p-hightpu-4t    2
    16  2x2x4     ct4p-hightpu-4t    4
    32  2x4x4     ct4p-hightpu-4t    8
    64  4x4x4     ct4p-hightpu-4t   16
   128  4x4x8     ct4p-hightpu-4t   32
   256  4x8x8     ct4p-hightpu-4t   64
   512  8x8x8     ct4p-hightpu-4t  128
  1024  8x8x16    ct4p-hightpu-4t  256
  2048  8x16x16   ct4p-hightpu-4t  512
  4096  16x16x16  ct4p-hightpu-4t 1024
tpu v5litepod tpu-v5-lite-podslice 4 amd64
     1  1x1       ct5lp-hightpu-1t   1
     4  2x2       ct5lp-hightpu-4t   1
     8  2x4       ct5lp-hightpu-8t   1
    16  4x4       ct5lp-hightpu-4t   4
    32  4x8       ct5lp-hightpu-4t   8
    64  8x8       ct5lp-hightpu-4t  16
   128  8x16      ct5lp-hightpu-4t  32
   256  16x16     ct5lp-hightpu-4t  64
tpu v5p tpu-v5p-slice 8 amd64
    +4  2x2x1     ct5p-hightpu-4t    1
     8  2x2x2     ct5p-hightpu-4t    2
    16  2x2x4     ct5p-hightpu-4t    4
    32  2x4x4     ct5p-hightpu-4t    8
   +64  4x4x4     ct5p-hightpu-4t   16
  +128  4x4x8     ct5p-hightpu-4t   32
  +256  4x8x8     ct5p-hightpu-4t   64
  +512  8x8x8     ct5p-hightpu-4t  128
  +1024 8x8x16    ct5p-hightpu-4t  256
  +2048 8x16x16   ct5p-hightpu-4t  512
  +4096 16x16x16  ct5p-hightpu-4t 1024
tpu v6e tpu-v6e-slice 8 amd64
    +1  1x1       ct6e-standard-1t   1
    +4  2x2       ct6e-standard-4t   1
     8  2x4       ct6e-standard-4t   2
    16  4x4       ct6e-standard-4t   4
   +32  4x8       ct6e-standard-4t   8
   +64  8x8       ct6e-standard-4t  16
  +128  8x16      ct6e-standard-4t  32
  +256  16x16     ct6e-standard-4t  64
tpu tpu7x tpu7x 4 amd64
    +4  2x2x1     tpu7x-standard-4t  1
    +8  2x2x2     tpu7x-standard-4t  2
   +16  2x2x4     tpu7x-standard-4t  4
   +32  2x4x4     tpu7x-standard-4t  8
   +64  4x4x4     tpu7x-standard-4t 16
  +128  4x4x8     tpu7x-standard-4t 32
  +256  4x8x8     tpu7x-standard-4t 64
  +512  8x8x8     tpu7x-standard-4t 128
  +1024 8x8x16    tpu7x-standard-4t 256
  +2048 8x16x16   tpu7x-standard-4t 512
  +4096 16x16x16  tpu7x-standard-4t 1024
"""


def _load_gpus(table: str) -> dict[str, GpuType]:
    gpus: dict[str, GpuType] = {}
    name = ""
    for line in table.strip().splitlines():
        words = line.split()
        if not line[0].isspace():  # a new GPU; continuation lines only add counts
            name, label, arch, words = words[0], words[1], words[2], words[3:]
            gpus[name] = GpuType(name=name, gke_label=label, counts={}, arch=_arch(arch))
        for pair in words:
            count, machine = pair.split(":")
            gpus[name].counts[int(count)] = machine
    return gpus


def _load_tpus(table: str) -> dict[str, TpuType]:
    tpus: dict[str, TpuType] = {}
    current: TpuType | None = None
    for words in (line.split() for line in table.strip().splitlines()):
        if words[0] == "tpu":
            _, name, label, default, arch = words
            current = TpuType(name, label, int(default), slices={}, arch=_arch(arch))
            tpus[name] = current
            continue
        assert current is not None, "TPU table row before any 'tpu' header"
        chips, topology, machine, hosts = words
        shape = TpuSlice(
            int(chips.lstrip("+")),
            topology,
            machine,
            int(hosts),
            in_kinetic=not chips.startswith("+"),
        )
        current.slices[shape.chips] = shape
    return tpus


def _arch(word: str) -> str:
    assert word in ARCHES, f"catalog arch {word!r} is not one of {ARCHES}"
    return word


#: GPU catalog: name -> type with its count -> machine-type map.
GPU_TYPES: dict[str, GpuType] = _load_gpus(_GPU_TABLE)
#: TPU catalog: name -> type with its chips -> slice map (``num_nodes`` = VMs).
TPU_TYPES: dict[str, TpuType] = _load_tpus(_TPU_TABLE)


# Users copy GKE node labels out of `kubectl get nodes`, so accept them as names.
GPU_ALIASES: dict[str, str] = {g.gke_label: g.name for g in GPU_TYPES.values()}
# TPU labels too, also as they read once the parser has taken "tpu-" off the front
# ("tpu-v6e-slice" is read as "tpu:" + "v6e-slice").
TPU_ALIASES: dict[str, str] = {
    "v5e": "v5litepod",
    "ironwood": "tpu7x",
    "v7x": "tpu7x",
    **{t.gke_accelerator: t.name for t in TPU_TYPES.values() if t.gke_accelerator != t.name},
    **{
        t.gke_accelerator.removeprefix("tpu-"): t.name
        for t in TPU_TYPES.values()
        if t.gke_accelerator.startswith("tpu-")
    },
}

# "gpu:N" / "tpu:N" pick the most capable hardware that has an N-sized shape: first
# among kinetic 0.0.4's shapes in kinetic's order (so every count kinetic resolved
# still means the same hardware), then among the shapes added since, in this order.
# Every GPU added since 0.0.4 comes in a count an older GPU has, so none of them is
# ever picked by count: name them ("gpu-h200x8").
GPU_PREFERENCE = (
    "h100",
    "a100-80gb",
    "a100",
    "l4",
    "v100",
    "t4",
    "p100",
    "p4",
    # added since 0.0.4:
    "gb200",
    "b200",
    "h200",
    "h100-mega",
    "rtx-pro-6000",
)
TPU_PREFERENCE = ("tpu7x", "v6e", "v5p", "v5litepod", "v4", "v3")

# Cloud TPU names v3 slices by TensorCores (two per chip): "v3-8" is the 4-chip
# 2x2 slice.  kinetic's catalog is indexed by chips, so "v3-8" only resolves via
# this fallback, used solely when N is not itself a valid chip count.
CORES_PER_CHIP_NAMING: dict[str, int] = {"v3": 2}


def gpu_spellings(gpu: GpuType) -> list[str]:
    """Every name ``gpu`` answers to: its name and its GKE label."""
    return [gpu.name, *(a for a, n in GPU_ALIASES.items() if n == gpu.name and a != gpu.name)]


def tpu_spellings(tpu: TpuType) -> list[str]:
    """Every name ``tpu`` answers to: its name, its aliases and its GKE label."""
    return [tpu.name, *(a for a, n in TPU_ALIASES.items() if n == tpu.name and a != tpu.name)]


def describe_catalog() -> str:
    """One-paragraph listing of known GPU/TPU names and their valid sizes, for messages."""
    gpus = ", ".join(f"{g.name} x{_join(g.counts)}" for g in GPU_TYPES.values())
    tpus = ", ".join(f"{t.name} ({_join(t.slices)} chips)" for t in TPU_TYPES.values())
    return (
        f"Known GPUs: {gpus}. Known TPUs: {tpus}; 'v5e' means v5litepod, 'ironwood' "
        "tpu7x; GKE accelerator labels are accepted as names."
    )


def _join(numbers: dict[int, object]) -> str:
    return "/".join(str(n) for n in numbers)
