"""Tests for the accelerator catalog and parser.

Expected values are written out here independently of the module's tables
(transcribed from the protocol notes, §2.8/§2.9, and for the rows added since
kinetic 0.0.4 from the GKE pages cited beside the tables), so a typo in either
place fails a test instead of being compared against itself.
"""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import pytest

from airflow_provider_kinetic.core.catalog.accelerators import (
    GPU_TYPES,
    TPU_TYPES,
    Accelerator,
    InvalidAcceleratorError,
    describe_catalog,
    parse_accelerator,
)

# name -> (gke label, {count: machine type})
EXPECTED_GPUS: dict[str, tuple[str, dict[int, str]]] = {
    "l4": (
        "nvidia-l4",
        {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
    ),
    "t4": ("nvidia-tesla-t4", {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16"}),
    "v100": (
        "nvidia-tesla-v100",
        {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32", 8: "n1-standard-64"},
    ),
    "a100": (
        "nvidia-tesla-a100",
        {
            1: "a2-highgpu-1g",
            2: "a2-highgpu-2g",
            4: "a2-highgpu-4g",
            8: "a2-highgpu-8g",
            16: "a2-megagpu-16g",
        },
    ),
    "a100-80gb": (
        "nvidia-a100-80gb",
        {
            1: "a2-ultragpu-1g",
            2: "a2-ultragpu-2g",
            4: "a2-ultragpu-4g",
            8: "a2-ultragpu-8g",
            16: "a2-ultragpu-16g",
        },
    ),
    "h100": (
        "nvidia-h100-80gb",
        {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
    ),
    "p4": ("nvidia-tesla-p4", {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16"}),
    "p100": ("nvidia-tesla-p100", {1: "n1-standard-4", 2: "n1-standard-8", 4: "n1-standard-16"}),
    # Added since kinetic 0.0.4.
    "h100-mega": ("nvidia-h100-mega-80gb", {8: "a3-megagpu-8g"}),
    "h200": ("nvidia-h200-141gb", {8: "a3-ultragpu-8g"}),
    "b200": ("nvidia-b200", {8: "a4-highgpu-8g"}),
    "gb200": ("nvidia-gb200", {4: "a4x-highgpu-4g"}),
    "rtx-pro-6000": (
        "nvidia-rtx-pro-6000",
        {1: "g4-standard-48", 2: "g4-standard-96", 4: "g4-standard-192", 8: "g4-standard-384"},
    ),
}
#: GPUs whose hosts are Arm (GB200: NVIDIA Grace CPUs); every other one is amd64.
ARM_GPUS = {"gb200"}

# name -> (gke accelerator, default chips)
EXPECTED_TPU_TYPES: dict[str, tuple[str, int]] = {
    "v3": ("tpu-v3-podslice", 4),
    "v4": ("tpu-v4-podslice", 4),
    "v5litepod": ("tpu-v5-lite-podslice", 4),
    "v5p": ("tpu-v5p-slice", 8),
    "v6e": ("tpu-v6e-slice", 8),
    "tpu7x": ("tpu7x", 4),
}

# (name, chips, topology, machine type, hosts)
EXPECTED_TPU_SLICES: list[tuple[str, int, str, str, int]] = [
    ("v3", 4, "2x2", "ct3-hightpu-4t", 1),
    ("v3", 16, "4x4", "ct3p-hightpu-4t", 4),
    ("v3", 32, "4x8", "ct3p-hightpu-4t", 8),
    ("v3", 64, "8x8", "ct3p-hightpu-4t", 16),
    ("v3", 128, "8x16", "ct3p-hightpu-4t", 32),
    ("v3", 256, "16x16", "ct3p-hightpu-4t", 64),
    ("v3", 512, "16x32", "ct3p-hightpu-4t", 128),
    ("v3", 1024, "32x32", "ct3p-hightpu-4t", 256),
    ("v3", 2048, "32x64", "ct3p-hightpu-4t", 512),
    ("v4", 4, "2x2x1", "ct4p-hightpu-4t", 1),
    ("v4", 8, "2x2x2", "ct4p-hightpu-4t", 2),
    ("v4", 16, "2x2x4", "ct4p-hightpu-4t", 4),
    ("v4", 32, "2x4x4", "ct4p-hightpu-4t", 8),
    ("v4", 64, "4x4x4", "ct4p-hightpu-4t", 16),
    ("v4", 128, "4x4x8", "ct4p-hightpu-4t", 32),
    ("v4", 256, "4x8x8", "ct4p-hightpu-4t", 64),
    ("v4", 512, "8x8x8", "ct4p-hightpu-4t", 128),
    ("v4", 1024, "8x8x16", "ct4p-hightpu-4t", 256),
    ("v4", 2048, "8x16x16", "ct4p-hightpu-4t", 512),
    ("v4", 4096, "16x16x16", "ct4p-hightpu-4t", 1024),
    ("v5litepod", 1, "1x1", "ct5lp-hightpu-1t", 1),
    ("v5litepod", 4, "2x2", "ct5lp-hightpu-4t", 1),
    ("v5litepod", 8, "2x4", "ct5lp-hightpu-8t", 1),
    ("v5litepod", 16, "4x4", "ct5lp-hightpu-4t", 4),
    ("v5litepod", 32, "4x8", "ct5lp-hightpu-4t", 8),
    ("v5litepod", 64, "8x8", "ct5lp-hightpu-4t", 16),
    ("v5litepod", 128, "8x16", "ct5lp-hightpu-4t", 32),
    ("v5litepod", 256, "16x16", "ct5lp-hightpu-4t", 64),
    ("v5p", 8, "2x2x2", "ct5p-hightpu-4t", 2),
    ("v5p", 16, "2x2x4", "ct5p-hightpu-4t", 4),
    ("v5p", 32, "2x4x4", "ct5p-hightpu-4t", 8),
    ("v6e", 8, "2x4", "ct6e-standard-4t", 2),
    ("v6e", 16, "4x4", "ct6e-standard-4t", 4),
]
# Shapes added since kinetic 0.0.4 (same columns).
NEW_TPU_SLICES: list[tuple[str, int, str, str, int]] = [
    ("v5p", 4, "2x2x1", "ct5p-hightpu-4t", 1),
    ("v5p", 64, "4x4x4", "ct5p-hightpu-4t", 16),
    ("v5p", 128, "4x4x8", "ct5p-hightpu-4t", 32),
    ("v5p", 256, "4x8x8", "ct5p-hightpu-4t", 64),
    ("v5p", 512, "8x8x8", "ct5p-hightpu-4t", 128),
    ("v5p", 1024, "8x8x16", "ct5p-hightpu-4t", 256),
    ("v5p", 2048, "8x16x16", "ct5p-hightpu-4t", 512),
    ("v5p", 4096, "16x16x16", "ct5p-hightpu-4t", 1024),
    ("v6e", 1, "1x1", "ct6e-standard-1t", 1),
    ("v6e", 4, "2x2", "ct6e-standard-4t", 1),
    ("v6e", 32, "4x8", "ct6e-standard-4t", 8),
    ("v6e", 64, "8x8", "ct6e-standard-4t", 16),
    ("v6e", 128, "8x16", "ct6e-standard-4t", 32),
    ("v6e", 256, "16x16", "ct6e-standard-4t", 64),
    ("tpu7x", 4, "2x2x1", "tpu7x-standard-4t", 1),
    ("tpu7x", 8, "2x2x2", "tpu7x-standard-4t", 2),
    ("tpu7x", 16, "2x2x4", "tpu7x-standard-4t", 4),
    ("tpu7x", 32, "2x4x4", "tpu7x-standard-4t", 8),
    ("tpu7x", 64, "4x4x4", "tpu7x-standard-4t", 16),
    ("tpu7x", 128, "4x4x8", "tpu7x-standard-4t", 32),
    ("tpu7x", 256, "4x8x8", "tpu7x-standard-4t", 64),
    ("tpu7x", 512, "8x8x8", "tpu7x-standard-4t", 128),
    ("tpu7x", 1024, "8x8x16", "tpu7x-standard-4t", 256),
    ("tpu7x", 2048, "8x16x16", "tpu7x-standard-4t", 512),
    ("tpu7x", 4096, "16x16x16", "tpu7x-standard-4t", 1024),
]
KINETIC_TPU_SLICES = list(EXPECTED_TPU_SLICES)
EXPECTED_TPU_SLICES = KINETIC_TPU_SLICES + NEW_TPU_SLICES

ALL_GPU_SHAPES = [(n, c) for n, (_, counts) in EXPECTED_GPUS.items() for c in counts]


# --------------------------------------------------------------------- catalog


def test_gpu_catalog_matches_spec_exactly() -> None:
    assert list(GPU_TYPES) == list(EXPECTED_GPUS)
    for name, (label, counts) in EXPECTED_GPUS.items():
        gpu = GPU_TYPES[name]
        assert (gpu.name, gpu.gke_label, gpu.counts) == (name, label, counts)
        assert gpu.arch == ("arm64" if name in ARM_GPUS else "amd64")
        assert all(gpu.chips_per_host(n) == n for n in counts)  # a GPU job is one host


def test_tpu_catalog_matches_spec_exactly() -> None:
    assert {n: (t.gke_accelerator, t.default_chips) for n, t in TPU_TYPES.items()} == (
        EXPECTED_TPU_TYPES
    )
    actual = [
        (t.name, s.chips, s.topology, s.machine_type, s.num_nodes)
        for t in TPU_TYPES.values()
        for s in t.slices.values()
    ]
    assert sorted(actual) == sorted(EXPECTED_TPU_SLICES)
    kinetic = [(t.name, *s[:4]) for t in TPU_TYPES.values() for s in _rows(t) if s[4]]
    assert sorted(kinetic) == sorted(KINETIC_TPU_SLICES)  # in_kinetic marks exactly those
    for tpu in TPU_TYPES.values():
        assert tpu.default_chips in tpu.slices
        assert tpu.arch == "amd64"  # TPU hosts are x86 VMs
        assert all(chips == s.chips for chips, s in tpu.slices.items())
        assert all(s.chips_per_host * s.num_nodes == s.chips for s in tpu.slices.values())


def _rows(tpu) -> list[tuple]:
    return [(s.chips, s.topology, s.machine_type, s.num_nodes, s.in_kinetic)
            for s in tpu.slices.values()]  # fmt: skip


@pytest.mark.parametrize(("name", "chips", "topology", "machine", "hosts"), EXPECTED_TPU_SLICES)
def test_tpu_slice_shape_is_consistent(
    name: str, chips: int, topology: str, machine: str, hosts: int
) -> None:
    # The topology multiplies out to the chip count, and the machine type's
    # "-Nt" suffix (chips per VM) times the host count gives it too.
    product = 1
    for dim in topology.split("x"):
        product *= int(dim)
    assert product == chips
    assert int(machine.rsplit("-", 1)[1].rstrip("t")) * hosts == chips


def test_describe_catalog_names_every_type_and_count() -> None:
    text = describe_catalog()
    for name in [*EXPECTED_GPUS, *EXPECTED_TPU_TYPES]:
        assert name in text
    assert "x1/2/4/8/16" in text  # a100 counts
    assert "4/8/16/32/64/128/256/512/1024/2048/4096 chips" in text  # v4
    assert "1/4/8/16/32/64/128/256 chips" in text  # v6e, from one chip
    assert "v5e" in text and "ironwood" in text


# --------------------------------------------------------------------- parsing

# spec -> (kind, name, count, topology, num_nodes, machine_type, gke_label)
PARSE_CASES: list[tuple[str, tuple]] = [
    ("cpu", ("cpu", "cpu", 0, None, 1, None, None)),
    ("cpu:8", ("cpu", "cpu", 8, None, 1, None, None)),
    ("  CPU  ", ("cpu", "cpu", 0, None, 1, None, None)),
    ("gpu", ("gpu", "l4", 1, None, 1, "g2-standard-4", "nvidia-l4")),
    ("gpu-l4", ("gpu", "l4", 1, None, 1, "g2-standard-4", "nvidia-l4")),
    ("l4", ("gpu", "l4", 1, None, 1, "g2-standard-4", "nvidia-l4")),
    ("gpu:l4", ("gpu", "l4", 1, None, 1, "g2-standard-4", "nvidia-l4")),
    ("nvidia-l4", ("gpu", "l4", 1, None, 1, "g2-standard-4", "nvidia-l4")),
    ("l4:2", ("gpu", "l4", 2, None, 1, "g2-standard-24", "nvidia-l4")),
    ("gpu-l4x2", ("gpu", "l4", 2, None, 1, "g2-standard-24", "nvidia-l4")),
    ("gpu:l4-2", ("gpu", "l4", 2, None, 1, "g2-standard-24", "nvidia-l4")),
    ("gpu-a100", ("gpu", "a100", 1, None, 1, "a2-highgpu-1g", "nvidia-tesla-a100")),
    ("gpu-a100x4", ("gpu", "a100", 4, None, 1, "a2-highgpu-4g", "nvidia-tesla-a100")),
    ("a100x16", ("gpu", "a100", 16, None, 1, "a2-megagpu-16g", "nvidia-tesla-a100")),
    ("nvidia-tesla-a100:8", ("gpu", "a100", 8, None, 1, "a2-highgpu-8g", "nvidia-tesla-a100")),
    ("a100-80gb", ("gpu", "a100-80gb", 1, None, 1, "a2-ultragpu-1g", "nvidia-a100-80gb")),
    ("gpu:a100-80gbx2", ("gpu", "a100-80gb", 2, None, 1, "a2-ultragpu-2g", "nvidia-a100-80gb")),
    ("GPU-H100X8", ("gpu", "h100", 8, None, 1, "a3-highgpu-8g", "nvidia-h100-80gb")),
    ("nvidia-tesla-t4x4", ("gpu", "t4", 4, None, 1, "n1-standard-16", "nvidia-tesla-t4")),
    # "gpu:N" and bare "N": first of h100, a100-80gb, a100, l4, ... with that count.
    ("gpu:1", ("gpu", "h100", 1, None, 1, "a3-highgpu-1g", "nvidia-h100-80gb")),
    ("gpu:4", ("gpu", "h100", 4, None, 1, "a3-highgpu-4g", "nvidia-h100-80gb")),
    ("gpu-8", ("gpu", "h100", 8, None, 1, "a3-highgpu-8g", "nvidia-h100-80gb")),
    ("gpu:16", ("gpu", "a100-80gb", 16, None, 1, "a2-ultragpu-16g", "nvidia-a100-80gb")),
    ("2", ("gpu", "h100", 2, None, 1, "a3-highgpu-2g", "nvidia-h100-80gb")),
    ("16", ("gpu", "a100-80gb", 16, None, 1, "a2-ultragpu-16g", "nvidia-a100-80gb")),
    # No GPU comes in 32, so bare "32" falls through to TPUs (v6e has no 32: v5p).
    ("32", ("tpu", "v5p", 32, "2x4x4", 8, "ct5p-hightpu-4t", "tpu-v5p-slice")),
    ("tpu", ("tpu", "v5litepod", 4, "2x2", 1, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice")),
    ("tpu-v5e-4", ("tpu", "v5litepod", 4, "2x2", 1, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice")),
    ("tpu-v5e-1", ("tpu", "v5litepod", 1, "1x1", 1, "ct5lp-hightpu-1t", "tpu-v5-lite-podslice")),
    ("v5e", ("tpu", "v5litepod", 4, "2x2", 1, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice")),
    (
        "tpu-v5litepod-4",
        ("tpu", "v5litepod", 4, "2x2", 1, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice"),
    ),
    (
        "tpu:v5litepod-2x4",
        ("tpu", "v5litepod", 8, "2x4", 1, "ct5lp-hightpu-8t", "tpu-v5-lite-podslice"),
    ),
    (
        "v5litepod-16",
        ("tpu", "v5litepod", 16, "4x4", 4, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice"),
    ),
    ("v5e:32", ("tpu", "v5litepod", 32, "4x8", 8, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice")),
    ("tpu-v6e-2x4", ("tpu", "v6e", 8, "2x4", 2, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu-v6e-8", ("tpu", "v6e", 8, "2x4", 2, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("v6e", ("tpu", "v6e", 8, "2x4", 2, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu:v6e-4x4", ("tpu", "v6e", 16, "4x4", 4, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu-v5p-8", ("tpu", "v5p", 8, "2x2x2", 2, "ct5p-hightpu-4t", "tpu-v5p-slice")),
    ("v5p", ("tpu", "v5p", 8, "2x2x2", 2, "ct5p-hightpu-4t", "tpu-v5p-slice")),
    ("tpu-v4-8", ("tpu", "v4", 8, "2x2x2", 2, "ct4p-hightpu-4t", "tpu-v4-podslice")),
    ("v4:4", ("tpu", "v4", 4, "2x2x1", 1, "ct4p-hightpu-4t", "tpu-v4-podslice")),
    ("tpu-v4-4x4x4", ("tpu", "v4", 64, "4x4x4", 16, "ct4p-hightpu-4t", "tpu-v4-podslice")),
    ("tpu:v3", ("tpu", "v3", 4, "2x2", 1, "ct3-hightpu-4t", "tpu-v3-podslice")),
    ("tpu-v3-16", ("tpu", "v3", 16, "4x4", 4, "ct3p-hightpu-4t", "tpu-v3-podslice")),
    # Cloud TPU's "v3-8" counts TensorCores (2 per chip): the 4-chip 2x2 slice.
    ("tpu-v3-8", ("tpu", "v3", 4, "2x2", 1, "ct3-hightpu-4t", "tpu-v3-podslice")),
    # "tpu:N": first of v6e, v5p, v5litepod, v4, v3 with N chips.
    ("tpu:1", ("tpu", "v5litepod", 1, "1x1", 1, "ct5lp-hightpu-1t", "tpu-v5-lite-podslice")),
    ("tpu:4", ("tpu", "v5litepod", 4, "2x2", 1, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice")),
    ("tpu:8", ("tpu", "v6e", 8, "2x4", 2, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu-16", ("tpu", "v6e", 16, "4x4", 4, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu:32", ("tpu", "v5p", 32, "2x4x4", 8, "ct5p-hightpu-4t", "tpu-v5p-slice")),
    ("tpu:64", ("tpu", "v5litepod", 64, "8x8", 16, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice")),
    ("tpu:512", ("tpu", "v4", 512, "8x8x8", 128, "ct4p-hightpu-4t", "tpu-v4-podslice")),
    # Added since kinetic 0.0.4: v6e from one chip, TPU7x (Ironwood), newer GPUs, and
    # GKE labels as names ("tpu-" prefix read as usual).
    ("tpu-v6e-1", ("tpu", "v6e", 1, "1x1", 1, "ct6e-standard-1t", "tpu-v6e-slice")),
    ("v6e-2x2", ("tpu", "v6e", 4, "2x2", 1, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu:v6e-256", ("tpu", "v6e", 256, "16x16", 64, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu-v6e-slice-16", ("tpu", "v6e", 16, "4x4", 4, "ct6e-standard-4t", "tpu-v6e-slice")),
    ("tpu-v5p-2x2x1", ("tpu", "v5p", 4, "2x2x1", 1, "ct5p-hightpu-4t", "tpu-v5p-slice")),
    (
        "tpu-v5-lite-podslice",
        ("tpu", "v5litepod", 4, "2x2", 1, "ct5lp-hightpu-4t", "tpu-v5-lite-podslice"),
    ),
    ("tpu7x", ("tpu", "tpu7x", 4, "2x2x1", 1, "tpu7x-standard-4t", "tpu7x")),
    ("tpu-tpu7x-8", ("tpu", "tpu7x", 8, "2x2x2", 2, "tpu7x-standard-4t", "tpu7x")),
    ("ironwood-4x4x4", ("tpu", "tpu7x", 64, "4x4x4", 16, "tpu7x-standard-4t", "tpu7x")),
    ("tpu:v7x-128", ("tpu", "tpu7x", 128, "4x4x8", 32, "tpu7x-standard-4t", "tpu7x")),
    ("gpu-h100-megax8", ("gpu", "h100-mega", 8, None, 1, "a3-megagpu-8g", "nvidia-h100-mega-80gb")),
    ("nvidia-h200-141gb:8", ("gpu", "h200", 8, None, 1, "a3-ultragpu-8g", "nvidia-h200-141gb")),
    ("b200x8", ("gpu", "b200", 8, None, 1, "a4-highgpu-8g", "nvidia-b200")),
    ("gpu:gb200x4", ("gpu", "gb200", 4, None, 1, "a4x-highgpu-4g", "nvidia-gb200")),
    (
        "rtx-pro-6000:2",
        ("gpu", "rtx-pro-6000", 2, None, 1, "g4-standard-96", "nvidia-rtx-pro-6000"),
    ),
    # "h100" stays A3 High (kinetic's); "gpu:8" stays eight of them.
    ("gpu-h100x8", ("gpu", "h100", 8, None, 1, "a3-highgpu-8g", "nvidia-h100-80gb")),
    ("8", ("gpu", "h100", 8, None, 1, "a3-highgpu-8g", "nvidia-h100-80gb")),
]


@pytest.mark.parametrize(("spec", "expected"), PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_forms(spec: str, expected: tuple) -> None:
    acc = parse_accelerator(spec)
    kind, name, count, topology, num_nodes, machine, label = expected
    assert (
        acc.kind,
        acc.name,
        acc.count,
        acc.topology,
        acc.num_nodes,
        acc.machine_type,
        acc.gke_label,
    ) == (kind, name, count, topology, num_nodes, machine, label)
    assert acc.spot is False
    assert acc.category == acc.jax_platform == kind
    assert acc.is_multi_host is (num_nodes > 1)


@pytest.mark.parametrize(
    ("spec", "kind", "name", "count"),
    [
        ("gpu-l4x2:spot", "gpu", "l4", 2),
        ("L4:2:SPOT", "gpu", "l4", 2),
        ("gpu:spot", "gpu", "l4", 1),
        ("tpu-v5e-4:spot", "tpu", "v5litepod", 4),
        ("tpu-v6e-2x4:spot ", "tpu", "v6e", 8),
        ("tpu:spot", "tpu", "v5litepod", 4),
        ("cpu:spot", "cpu", "cpu", 0),
        ("cpu:4:spot", "cpu", "cpu", 4),
    ],
)
def test_spot_suffix(spec: str, kind: str, name: str, count: int) -> None:
    acc = parse_accelerator(spec)
    assert (acc.kind, acc.name, acc.count, acc.spot) == (kind, name, count, True)
    assert acc.canonical.endswith(":spot")
    assert dataclasses.replace(acc, spot=False) == parse_accelerator(spec.strip()[: -len(":spot")])


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("cpu", "cpu"),
        ("CPU:8", "cpu:8"),
        ("gpu", "gpu-l4x1"),
        ("l4:2", "gpu-l4x2"),
        ("nvidia-tesla-a100x4", "gpu-a100x4"),
        ("tpu", "tpu-v5litepod-2x2"),
        ("tpu-v5e-4", "tpu-v5litepod-2x2"),
        ("tpu-v6e-8", "tpu-v6e-2x4"),
        ("tpu-v3-8", "tpu-v3-2x2"),
        ("gpu-l4x2:spot", "gpu-l4x2:spot"),
        ("tpu-v5e-4:spot", "tpu-v5litepod-2x2:spot"),
    ],
)
def test_canonical_spelling(spec: str, canonical: str) -> None:
    assert parse_accelerator(spec).canonical == canonical


@pytest.mark.parametrize("spot", [False, True])
@pytest.mark.parametrize(("name", "count"), ALL_GPU_SHAPES)
def test_canonical_round_trips_every_gpu_count(name: str, count: int, spot: bool) -> None:
    suffix = ":spot" if spot else ""
    acc = parse_accelerator(f"gpu:{name}x{count}{suffix}")
    assert (acc.name, acc.count, acc.spot) == (name, count, spot)
    assert acc.machine_type == EXPECTED_GPUS[name][1][count]
    assert parse_accelerator(acc.canonical) == acc
    assert parse_accelerator(acc.canonical.upper()) == acc
    # The GKE-label alias and the "name:N" form land on the same accelerator.
    assert parse_accelerator(f"{EXPECTED_GPUS[name][0]}:{count}{suffix}") == acc


@pytest.mark.parametrize("spot", [False, True])
@pytest.mark.parametrize(("name", "chips", "topology", "machine", "hosts"), EXPECTED_TPU_SLICES)
def test_canonical_round_trips_every_tpu_slice(
    name: str, chips: int, topology: str, machine: str, hosts: int, spot: bool
) -> None:
    suffix = ":spot" if spot else ""
    by_chips = parse_accelerator(f"tpu-{name}-{chips}{suffix}")
    by_topology = parse_accelerator(f"{name}-{topology}{suffix}")
    assert by_chips == by_topology
    assert (by_chips.count, by_chips.topology, by_chips.machine_type) == (chips, topology, machine)
    assert (by_chips.num_nodes, by_chips.chips_per_host, by_chips.spot) == (
        hosts,
        chips // hosts,
        spot,
    )
    assert parse_accelerator(by_chips.canonical) == by_chips


def test_cpu_canonical_round_trips() -> None:
    for spec in ("cpu", "cpu:1", "cpu:16", "cpu:spot", "cpu:2:spot"):
        acc = parse_accelerator(spec)
        assert parse_accelerator(acc.canonical) == acc


# ------------------------------------------------------------------ pod fields

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {
    "key": "cloud.google.com/gke-spot",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}

# spec -> (node selector, tolerations, resource limits, chips_per_host)
POD_FIELD_CASES: list[tuple[str, dict, list, dict, int]] = [
    ("cpu", {}, [], {}, 0),
    ("cpu:4", {}, [], {}, 0),
    (
        "cpu:spot",
        {"cloud.google.com/gke-spot": "true"},
        [SPOT_TOLERATION],
        {},
        0,
    ),
    (
        "gpu-l4x2",
        {"cloud.google.com/gke-accelerator": "nvidia-l4"},
        [GPU_TOLERATION],
        {"nvidia.com/gpu": "2"},
        2,
    ),
    (
        "gpu-l4x2:spot",
        {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-spot": "true"},
        [GPU_TOLERATION, SPOT_TOLERATION],
        {"nvidia.com/gpu": "2"},
        2,
    ),
    (
        "tpu-v5e-4",
        {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "2x2",
        },
        [TPU_TOLERATION],
        {"google.com/tpu": "4"},
        4,
    ),
    (
        "tpu-v6e-2x4",
        {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "2x4",
        },
        [TPU_TOLERATION],
        {"google.com/tpu": "4"},
        4,
    ),
    (
        "tpu-v6e-2x4:spot",
        {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "2x4",
            "cloud.google.com/gke-spot": "true",
        },
        [TPU_TOLERATION, SPOT_TOLERATION],
        {"google.com/tpu": "4"},
        4,
    ),
    (
        "tpu-v5litepod-2x4",
        {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "2x4",
        },
        [TPU_TOLERATION],
        {"google.com/tpu": "8"},
        8,
    ),
]


@pytest.mark.parametrize(
    ("spec", "selector", "tolerations", "limits", "per_host"),
    POD_FIELD_CASES,
    ids=[c[0] for c in POD_FIELD_CASES],
)
def test_pod_fields(
    spec: str, selector: dict, tolerations: list, limits: dict, per_host: int
) -> None:
    acc = parse_accelerator(spec)
    assert acc.node_selector() == selector
    assert acc.tolerations() == tolerations
    assert acc.resource_limits() == limits
    assert acc.chips_per_host == per_host


@pytest.mark.parametrize("chips", sorted({c for t in TPU_TYPES.values() for c in t.slices}))
def test_tpu_count_prefers_kinetic_shapes_then_the_most_capable(chips: int) -> None:
    # "tpu:N" lands where kinetic 0.0.4 put it whenever kinetic had an N-chip shape
    # (e.g. "tpu:4" is still v5litepod, not the newer v6e or tpu7x 4-chip slices);
    # only a count no 0.0.4 shape has goes to the newest generation with it.
    from airflow_provider_kinetic.core.catalog.hardware import TPU_PREFERENCE

    acc = parse_accelerator(f"tpu:{chips}")
    kinetic = [n for n, c, *_ in KINETIC_TPU_SLICES if c == chips]
    order = [n for n in ("v6e", "v5p", "v5litepod", "v4", "v3") if n in kinetic]
    if order:
        assert acc.name == order[0]
    else:
        assert acc.name == next(n for n in TPU_PREFERENCE if chips in TPU_TYPES[n].slices)
    assert TPU_TYPES[acc.name].slices[chips].in_kinetic is bool(order)


def test_tpu_count_only_newer_shapes_have_goes_to_the_most_capable(monkeypatch) -> None:
    # No count is new-only in today's catalog; add one to two generations to see the
    # second pass pick the first of them in TPU_PREFERENCE (tpu7x before v5p).
    from airflow_provider_kinetic.core.catalog.hardware import TpuSlice

    for name in ("v5p", "tpu7x"):
        machine = TPU_TYPES[name].slices[8].machine_type
        shape = TpuSlice(8192, "16x16x32", machine, 2048, in_kinetic=False)
        monkeypatch.setitem(TPU_TYPES[name].slices, 8192, shape)
    acc = parse_accelerator("tpu:8192")
    assert (acc.name, acc.topology, acc.num_nodes) == ("tpu7x", "16x16x32", 2048)
    monkeypatch.delitem(TPU_TYPES["tpu7x"].slices, 8192)
    assert parse_accelerator("tpu:8192").name == "v5p"


@pytest.mark.parametrize(("name", "count"), ALL_GPU_SHAPES)
def test_gpu_count_keeps_kinetics_choice(name: str, count: int) -> None:
    # "gpu:N" picks among kinetic's GPUs in kinetic's order; the newer ones (all in
    # counts an older GPU has) are asked for by name.
    acc = parse_accelerator(f"gpu:{count}")
    order = ("h100", "a100-80gb", "a100", "l4", "v100", "t4", "p100", "p4")
    assert acc.name == next(n for n in order if count in EXPECTED_GPUS[n][1])


def test_arm_gpu_pins_arm_nodes_and_tolerates_their_taint() -> None:
    acc = parse_accelerator("gpu-gb200x4:spot")
    assert (acc.arch, acc.platform, acc.chips_per_host) == ("arm64", "linux/arm64", 4)
    assert acc.node_selector() == {
        "cloud.google.com/gke-accelerator": "nvidia-gb200",
        "kubernetes.io/arch": "arm64",
        "cloud.google.com/gke-spot": "true",
    }
    arm = {"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64",
           "effect": "NoSchedule"}  # fmt: skip
    assert acc.tolerations() == [GPU_TOLERATION, arm, SPOT_TOLERATION]
    assert acc.resource_limits() == {"nvidia.com/gpu": "4"}
    # amd64 accelerators say nothing about the architecture (kinetic's pods exactly).
    for spec in ("gpu-h200x8", "tpu-tpu7x-2x2x1", "cpu"):
        amd = parse_accelerator(spec)
        assert (amd.arch, amd.platform) == ("amd64", "linux/amd64")
        assert "kubernetes.io/arch" not in amd.node_selector()
        assert all(t["key"] != "kubernetes.io/arch" for t in amd.tolerations())


def test_multi_host_tpu_requests_chips_per_host() -> None:
    acc = parse_accelerator("tpu-v6e-2x4")
    assert (acc.count, acc.num_nodes, acc.is_multi_host) == (8, 2, True)
    assert acc.resource_limits() == {"google.com/tpu": "4"}
    assert parse_accelerator("tpu-v5e-4").is_multi_host is False


def test_spot_toleration_carries_value() -> None:
    # kinetic's GKE builder drops `value`; an Equal toleration without it does
    # not tolerate GKE's spot taint, so ours must keep it.
    spot = parse_accelerator("gpu:spot").tolerations()[-1]
    assert spot["value"] == "true"
    assert spot["operator"] == "Equal"


def test_pod_field_results_are_fresh_copies() -> None:
    acc = parse_accelerator("tpu-v5e-4:spot")
    acc.tolerations()[-1]["value"] = "mutated"
    acc.node_selector()["x"] = "y"
    assert acc.tolerations()[-1]["value"] == "true"
    assert "x" not in acc.node_selector()


def test_accelerator_is_frozen_and_hashable() -> None:
    acc = parse_accelerator("l4:2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.count = 4  # type: ignore[misc]
    assert len({acc, parse_accelerator("gpu-l4x2")}) == 1
    assert isinstance(acc, Accelerator)


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("bad", "must_mention"),
    [
        ("gpu-l4x3", ["1, 2, 4, 8"]),
        ("l4:3", ["1, 2, 4, 8"]),
        ("tpu-v5e-3", ["v5litepod", "1, 4, 8, 16, 32, 64, 128, 256", "2x2"]),
        ("tpu-v6e-9x9", ["9x9", "2x4, 4x4", "8, 16"]),
        ("tpu-v5p-12", ["4, 8, 16, 32, 64", "2x2x1, 2x2x2"]),
        ("gpu-h200x4", ["8"]),
        ("gb200:8", ["4"]),
        ("tpu-tpu7x-2x2", ["2x2", "2x2x1"]),
        ("quantum", ["Known GPUs", "Known TPUs"]),
        ("gpu:quantum", ["unknown GPU"]),
        ("tpu:quantum", ["unknown"]),
        ("gpu:3", ["1, 2, 4, 8, 16"]),
        ("tpu:3", ["4096"]),
        ("3", ["no GPU count or TPU slice"]),
        ("cpu:many", ["whole number"]),
        ("", ["empty"]),
        ("   ", ["empty"]),
        (":spot", ["empty"]),
        ("gpu:", []),
        (None, ["str"]),
        (5, ["int"]),
        (["tpu"], ["list"]),
    ],
    ids=repr,
)
def test_invalid_accelerators(bad: object, must_mention: list[str]) -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        parse_accelerator(bad)  # type: ignore[arg-type]
    message = str(info.value)
    assert repr(bad) in message
    assert "cpu" in message and "cpu:N" in message and ":spot" in message
    assert "tpu-v6e-2x4" in message and "gpu-a100x4" in message
    for fragment in must_mention:
        assert fragment in message
    assert isinstance(info.value, ValueError)
    assert info.value.value == bad


def test_error_lists_known_names() -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        parse_accelerator("quantum")
    for name in [*EXPECTED_GPUS, *EXPECTED_TPU_TYPES]:
        assert name in str(info.value)


def test_error_survives_pickling() -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        parse_accelerator("gpu-l4x3")
    clone = pickle.loads(pickle.dumps(info.value))
    assert type(clone) is InvalidAcceleratorError
    assert str(clone) == str(info.value)
    assert (clone.value, clone.reason) == ("gpu-l4x3", info.value.reason)


def test_module_imports_no_airflow_or_kubernetes() -> None:
    # The pod runner imports this module; it must stay stdlib-only.
    code = (
        "import sys, airflow_provider_kinetic.core.catalog.accelerators\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'kubernetes'})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("spec", "spot", "expected"),
    [
        ("tpu-v5e-4", True, "tpu-v5e-4:spot"),
        ("tpu-v5e-4:spot", True, "tpu-v5e-4:spot"),
        (" gpu-l4 ", True, "gpu-l4:spot"),
        ("GPU-L4:SPOT", True, "GPU-L4:SPOT"),
        ("cpu", False, "cpu"),
    ],
)
def test_spot_keyword_equals_the_suffix(spec, spot, expected):
    from airflow_provider_kinetic.core.catalog.accelerators import with_spot

    assert with_spot(spec, spot) == expected
    assert parse_accelerator(with_spot(spec, spot)).spot is (spot or spec.lower().endswith(":spot"))
