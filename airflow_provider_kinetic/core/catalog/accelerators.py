"""The accelerator parser, wire-compatible with kinetic 0.0.4.

An ``accelerator=`` string decides the pod's node selector, tolerations,
resource limits, ``JAX_PLATFORMS``, the base-image category and (through
``num_nodes``) whether the job runs as a plain GKE Job or a multi-host
LeaderWorkerSet.  Every one of those decisions is derived here, from a single
parsed :class:`Accelerator`, so that the operator, the pod builder and the CLI
can never disagree about what ``"tpu-v6e-8"`` means.

The grammar and the catalog follow kinetic's (protocol notes §2.8/§2.9): a
string that kinetic accepts must land on the same hardware here, because a
job's pods must be schedulable on node pools that ``kinetic up`` provisioned.
The tables live in ``accelerator_catalog`` (the layer below; re-exported here).
Both modules are stdlib-only on purpose: the pod runner imports them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from airflow_provider_kinetic.core.catalog.hardware import (
    ARCHES,
    CORES_PER_CHIP_NAMING,
    GPU_ALIASES,
    GPU_PREFERENCE,
    GPU_TYPES,
    TPU_ALIASES,
    TPU_PREFERENCE,
    TPU_TYPES,
    GpuType,
    TpuSlice,
    TpuType,
    describe_catalog,
)
from airflow_provider_kinetic.core.errors import KineticError

__all__ = [
    "ARCHES",
    "GPU_TYPES",
    "TPU_TYPES",
    "Accelerator",
    "GpuType",
    "InvalidAcceleratorError",
    "TpuSlice",
    "TpuType",
    "describe_catalog",
    "parse_accelerator",
    "with_spot",
]

_ALLOWED_FORMS = (
    '"cpu", "cpu:N", "gpu", "gpu:N", "N", "gpu-l4", "gpu-a100x4", "l4:2", '
    '"gpu-h200x8", "tpu", "tpu:N", "tpu-v5e-4", "tpu-v6e-2x4", "tpu-v5litepod", '
    '"tpu-tpu7x-2x2x1", '
    'any of them with a ":spot" suffix'
)


class InvalidAcceleratorError(KineticError, ValueError):
    """An accelerator string that names no hardware kinetic can schedule.

    The message always repeats the offending value and the accepted forms,
    because these errors surface in DAG import/parse logs far from the code
    that produced the string; the user should be able to fix it from the
    message alone.
    """

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(
            f"Invalid accelerator {value!r}: {reason}. "
            f"Allowed forms: {_ALLOWED_FORMS}. {describe_catalog()}"
        )

    def __reduce__(self) -> tuple[type[InvalidAcceleratorError], tuple[object, str]]:
        # Airflow ships exceptions between processes; keep them picklable
        # despite the two-argument constructor.
        return (type(self), (self.value, self.reason))


# "l4x2", "l4:2" and "l4-2" (the last is in kinetic's docstring though its code rejects it).
_GPU_MULTI_RE = re.compile(r"^(?P<name>.+?)(?:x|-|:)(?P<n>\d+)$")
_TPU_TOPOLOGY_RE = re.compile(r"^(?P<name>.+)[-:](?P<topo>\d+x\d+(?:x\d+)?)$")
_TPU_CHIPS_RE = re.compile(r"^(?P<name>.+)[-:](?P<n>\d+)$")
_SPOT_SUFFIX = ":spot"
_SPOT_TOLERATION = {
    "key": "cloud.google.com/gke-spot",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
_ARCH_LABEL = "kubernetes.io/arch"
# Arm node pools are often tainted kubernetes.io/arch=arm64:NoSchedule; tolerating the
# taint is harmless where a node has none.
_ARM_TOLERATION = {
    "key": _ARCH_LABEL,
    "operator": "Equal",
    "value": "arm64",
    "effect": "NoSchedule",
}


@dataclass(frozen=True)
class Accelerator:
    """A fully resolved accelerator: everything the pod spec needs, no lookups left."""

    kind: Literal["cpu", "gpu", "tpu"]
    name: str
    count: int
    spot: bool = False
    gke_label: str | None = None
    topology: str | None = None
    machine_type: str | None = None
    num_nodes: int = 1
    #: The hosts' CPU architecture (``ARCHES``): the image must be built for it.
    arch: Literal["amd64", "arm64"] = "amd64"

    @property
    def category(self) -> Literal["cpu", "gpu", "tpu"]:
        """Base-image category (``base-{category}``); same as :attr:`kind`."""
        return self.kind

    @property
    def jax_platform(self) -> Literal["cpu", "gpu", "tpu"]:
        """Value for ``JAX_PLATFORMS`` in the pod, so JAX never probes other backends."""
        return self.kind

    @property
    def chips_per_host(self) -> int:
        """Devices each pod must request: a TPU pod sees only its own host's chips."""
        if self.kind == "tpu":
            return self.count // self.num_nodes
        if self.kind == "gpu":
            return self.count
        return 0

    @property
    def platform(self) -> str:
        """The container platform the hosts run (``linux/amd64``, ``linux/arm64``)."""
        return f"linux/{self.arch}"

    @property
    def is_multi_host(self) -> bool:
        """Whether the slice spans VMs (kinetic then defaults to the Pathways backend)."""
        return self.num_nodes > 1

    @property
    def canonical(self) -> str:
        """A normalized spelling that :func:`parse_accelerator` maps back to ``self``.

        Stored in job records so that two spellings of the same hardware
        ("v5e-4", "tpu:v5litepod-2x2") compare equal as strings.
        """
        if self.kind == "cpu":
            text = f"cpu:{self.count}" if self.count else "cpu"
        elif self.kind == "gpu":
            text = f"gpu-{self.name}x{self.count}"
        else:
            text = f"tpu-{self.name}-{self.topology}"
        return text + _SPOT_SUFFIX if self.spot else text

    def node_selector(self) -> dict[str, str]:
        """``spec.nodeSelector`` that pins the pod to a matching node pool."""
        selector: dict[str, str] = {}
        if self.kind == "tpu":
            selector["cloud.google.com/gke-tpu-accelerator"] = str(self.gke_label)
            selector["cloud.google.com/gke-tpu-topology"] = str(self.topology)
        elif self.kind == "gpu":
            selector["cloud.google.com/gke-accelerator"] = str(self.gke_label)
        if self.arch != "amd64":
            selector[_ARCH_LABEL] = self.arch
        if self.spot:
            selector["cloud.google.com/gke-spot"] = "true"
        return selector

    def tolerations(self) -> list[dict[str, str]]:
        """Tolerations (camelCase, as in a pod manifest) for GKE's accelerator/spot taints.

        Unlike kinetic's GKE builder, the spot toleration keeps ``value: "true"``:
        an ``Equal`` toleration without a value does not match GKE's spot taint.
        """
        result: list[dict[str, str]] = []
        taint_key = {"tpu": "google.com/tpu", "gpu": "nvidia.com/gpu"}.get(self.kind)
        if taint_key:
            result.append({"key": taint_key, "operator": "Exists", "effect": "NoSchedule"})
        if self.arch == "arm64":
            result.append(dict(_ARM_TOLERATION))
        if self.spot:
            result.append(dict(_SPOT_TOLERATION))
        return result

    def resource_limits(self) -> dict[str, str]:
        """Container limits (also used as requests); CPU jobs request nothing, as in kinetic."""
        if self.kind == "tpu":
            return {"google.com/tpu": str(self.chips_per_host)}
        if self.kind == "gpu":
            return {"nvidia.com/gpu": str(self.count)}
        return {}


def _make_gpu(value: object, gpu: GpuType, count: int, spot: bool) -> Accelerator:
    if count not in gpu.counts:
        valid = ", ".join(str(c) for c in gpu.counts)
        raise InvalidAcceleratorError(
            value, f"GPU {gpu.name!r} does not come in count {count}; valid counts: {valid}"
        )
    return Accelerator(
        kind="gpu",
        name=gpu.name,
        count=count,
        spot=spot,
        gke_label=gpu.gke_label,
        machine_type=gpu.counts[count],
        arch="arm64" if gpu.arch == "arm64" else "amd64",  # the catalog checks it
    )


def _make_tpu(value: object, tpu: TpuType, chips: int, spot: bool) -> Accelerator:
    if chips not in tpu.slices:
        raise InvalidAcceleratorError(
            value, f"TPU {tpu.name!r} has no {chips}-chip slice; {_tpu_shapes(tpu)}"
        )
    shape = tpu.slices[chips]
    return Accelerator(
        kind="tpu",
        name=tpu.name,
        count=chips,
        spot=spot,
        gke_label=tpu.gke_accelerator,
        topology=shape.topology,
        machine_type=shape.machine_type,
        num_nodes=shape.num_nodes,
        arch="arm64" if tpu.arch == "arm64" else "amd64",
    )


def _tpu_shapes(tpu: TpuType) -> str:
    chips = ", ".join(str(c) for c in tpu.slices)
    topologies = ", ".join(s.topology for s in tpu.slices.values())
    return f"valid chip counts: {chips}; valid topologies: {topologies}"


def _parse_gpu(value: object, body: str, spot: bool) -> Accelerator | None:
    """Resolve a GPU body ("4", "l4", "l4x2", "nvidia-l4:2").

    Returns ``None`` when the body names no GPU (or a count no GPU has), so an
    unprefixed string can still be tried as a TPU; a known GPU in a size it does
    not come in raises right away, because no TPU reading could be meant.
    """
    if body.isdigit():
        count = int(body)
        for name in GPU_PREFERENCE:
            if count in GPU_TYPES[name].counts:
                return _make_gpu(value, GPU_TYPES[name], count, spot)
        return None
    name = GPU_ALIASES.get(body, body)
    if name in GPU_TYPES:
        return _make_gpu(value, GPU_TYPES[name], 1, spot)
    match = _GPU_MULTI_RE.match(body)
    if match:
        name = GPU_ALIASES.get(match["name"], match["name"])
        if name in GPU_TYPES:
            return _make_gpu(value, GPU_TYPES[name], int(match["n"]), spot)
    return None


def _tpu_named(name: str) -> TpuType | None:
    return TPU_TYPES.get(TPU_ALIASES.get(name, name))


def _tpu_by_chips(value: object, chips: int, spot: bool) -> Accelerator | None:
    """The most capable TPU generation with a ``chips``-chip slice, if any: among
    kinetic 0.0.4's shapes first (a count kinetic resolved keeps its hardware), then
    among the shapes added since."""
    for kinetic_only in (True, False):
        for name in TPU_PREFERENCE:
            shape = TPU_TYPES[name].slices.get(chips)
            if shape is not None and (shape.in_kinetic or not kinetic_only):
                return _make_tpu(value, TPU_TYPES[name], chips, spot)
    return None


def _parse_tpu(value: object, body: str, spot: bool) -> Accelerator:
    """Resolve a TPU body ("8", "v5e", "v5e-4", "v6e-2x4", "v4:8") or raise."""
    if body.isdigit():
        result = _tpu_by_chips(value, int(body), spot)
        if result is None:
            valid = sorted({c for t in TPU_TYPES.values() for c in t.slices})
            raise InvalidAcceleratorError(
                value, f"no TPU has a {body}-chip slice; valid chip counts: {valid}"
            )
        return result
    tpu = _tpu_named(body)
    if tpu:
        return _make_tpu(value, tpu, tpu.default_chips, spot)
    match = _TPU_TOPOLOGY_RE.match(body)
    tpu = _tpu_named(match["name"]) if match else None
    if match and tpu:
        for shape in tpu.slices.values():
            if shape.topology == match["topo"]:
                return _make_tpu(value, tpu, shape.chips, spot)
        raise InvalidAcceleratorError(
            value, f"TPU {tpu.name!r} has no topology {match['topo']}; {_tpu_shapes(tpu)}"
        )
    match = _TPU_CHIPS_RE.match(body)
    tpu = _tpu_named(match["name"]) if match else None
    if match and tpu:
        chips = int(match["n"])
        per_chip = CORES_PER_CHIP_NAMING.get(tpu.name, 1)
        if chips not in tpu.slices and chips % per_chip == 0 and chips // per_chip in tpu.slices:
            chips //= per_chip
        return _make_tpu(value, tpu, chips, spot)
    raise InvalidAcceleratorError(value, f"unknown accelerator {body!r}")


def parse_accelerator(spec: str) -> Accelerator:
    """Parse an ``accelerator=`` string into a resolved :class:`Accelerator`.

    Follows kinetic's rules: case and surrounding blanks are ignored; a
    ``:spot`` suffix requests spot VMs; ``gpu-``/``tpu-`` prefixes mean the
    same as ``gpu:``/``tpu:``; a string without a prefix is tried as a GPU
    first, then as a TPU (so bare ``"8"`` is eight H100s, ``"32"`` a v5p-32).

    Raises:
        InvalidAcceleratorError: for non-strings, empty strings, unknown names,
            and known hardware asked for in a size that does not exist.
    """
    if not isinstance(spec, str):
        raise InvalidAcceleratorError(spec, f"expected a string, got {type(spec).__name__}")
    text = spec.strip().lower()
    spot = text.endswith(_SPOT_SUFFIX)
    if spot:
        text = text[: -len(_SPOT_SUFFIX)].strip()
    if not text:
        raise InvalidAcceleratorError(spec, "the accelerator name is empty")
    if text.startswith(("gpu-", "tpu-")):
        text = f"{text[:3]}:{text[4:]}"

    if text == "cpu":
        return Accelerator(kind="cpu", name="cpu", count=0, spot=spot)
    if text.startswith("cpu:"):
        if text[4:].isdigit():
            return Accelerator(kind="cpu", name="cpu", count=int(text[4:]), spot=spot)
        raise InvalidAcceleratorError(spec, "'cpu:' must be followed by a whole number")
    if text == "gpu":
        return _make_gpu(spec, GPU_TYPES["l4"], 1, spot)
    if text == "tpu":
        default = TPU_TYPES["v5litepod"]
        return _make_tpu(spec, default, default.default_chips, spot)

    if text.startswith("gpu:"):
        body = text[4:]
        result = _parse_gpu(spec, body, spot)
        if result is None:
            counts = sorted({c for g in GPU_TYPES.values() for c in g.counts})
            reason = f"no GPU comes in count {body}; valid counts: {counts}"
            raise InvalidAcceleratorError(spec, reason if body.isdigit() else "unknown GPU")
        return result
    if text.startswith("tpu:"):
        return _parse_tpu(spec, text[4:], spot)
    if text.isdigit():
        # Bare "N": GPUs first (kinetic's order), then TPU chip counts.
        result = _parse_gpu(spec, text, spot) or _tpu_by_chips(spec, int(text), spot)
        if result is None:
            raise InvalidAcceleratorError(spec, f"no GPU count or TPU slice has {text} devices")
        return result
    return _parse_gpu(spec, text, spot) or _parse_tpu(spec, text, spot)


def with_spot(spec: str, spot: bool) -> str:
    """``spec`` with kinetic's ``:spot`` suffix added when ``spot`` asks for it.

    ``spot=True`` and the suffix mean the same (kinetic accepts both); a spec that
    already ends in ``:spot`` is returned unchanged.
    """
    if not spot or not isinstance(spec, str) or spec.strip().lower().endswith(_SPOT_SUFFIX):
        return spec
    return spec.strip() + _SPOT_SUFFIX
