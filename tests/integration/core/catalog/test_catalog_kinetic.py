"""Every accelerator string kinetic 0.0.4 accepts lands on the same hardware here.

kinetic's own catalog (``kinetic.core.accelerators``: its GPU and TPU tables, aliases
and parser) is walked: every name and alias, in every prefix form, every count and
chip count, every topology, bare numbers and the ``:spot`` suffix.  For each string
kinetic's parser accepts, ours must give the same GKE label, topology, machine type,
chip count, node count and spot flag.  Our catalog may accept more (newer hardware,
more sizes); it may not read a kinetic string differently.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_kinetic.core.catalog.accelerators import (
    GPU_TYPES,
    TPU_TYPES,
    Accelerator,
    InvalidAcceleratorError,
    parse_accelerator,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("kinetic") is None,
    reason="keras-kinetic==0.0.4 not installed (scripts/test.sh installs it)",
)


@pytest.fixture(scope="module")
def kinetic() -> Any:
    from kinetic.core import accelerators

    return accelerators


def spellings(kinetic: Any) -> Iterator[str]:
    """Every string worth asking kinetic about (it rejects some; those are skipped)."""
    gpu_names = [*kinetic.GPUS, *kinetic._GPU_ALIASES]
    tpu_names = [*kinetic.TPUS, *kinetic.TPU_ALIASES]
    counts = sorted({c for s in kinetic.GPUS.values() for c in s.counts})
    chips = sorted({c for s in kinetic.TPUS.values() for c in s.topologies})
    topologies = sorted({t.topology for s in kinetic.TPUS.values() for t in s.topologies.values()})
    yield from ("cpu", "cpu:1", "cpu:8", "gpu", "tpu")
    for n in range(0, 4100):  # every count and chip count, and the gaps between them
        yield from (str(n), f"gpu:{n}", f"gpu-{n}", f"tpu:{n}", f"tpu-{n}")
    for name in gpu_names:
        for body in (name, *(f"{name}x{c}" for c in [*counts, 3])):
            yield from (body, f"gpu:{body}", f"gpu-{body}")
    for name in tpu_names:
        sizes = [*(str(c) for c in [*chips, 2, 3]), *topologies]
        for body in (name, *(f"{name}-{size}" for size in sizes)):
            yield from (body, f"tpu:{body}", f"tpu-{body}")


def variants(spec: str) -> Iterator[str]:
    yield from (spec, f"{spec}:spot", f"  {spec.upper()} ", f"{spec.upper()}:SPOT")


def same_hardware(ours: Accelerator, theirs: Any) -> None:
    if theirs is None:
        assert ours.kind == "cpu"
        return
    fields = ("name", "gke_label", "machine_type", "spot")
    if hasattr(theirs, "chips"):  # TpuConfig
        assert (ours.kind, ours.count, ours.topology, ours.num_nodes) == (
            "tpu", theirs.chips, theirs.topology, theirs.num_nodes,
        )  # fmt: skip
        assert ours.gke_label == theirs.gke_accelerator
        fields = ("name", "machine_type", "spot")
    else:  # GpuConfig
        assert (ours.kind, ours.count, ours.num_nodes, ours.topology) == (
            "gpu", theirs.count, 1, None,
        )  # fmt: skip
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]


def test_catalog_tables_include_kinetics_rows_unchanged(kinetic: Any) -> None:
    for name, spec in kinetic.GPUS.items():
        ours = GPU_TYPES[name]
        assert ours.gke_label == spec.gke_label
        assert {c: ours.counts[c] for c in spec.counts} == spec.counts
    for name, spec in kinetic.TPUS.items():
        ours = TPU_TYPES[name]
        assert (ours.gke_accelerator, ours.default_chips) == (
            spec.gke_accelerator,
            spec.default_chips,
        )
        for chips, topo in spec.topologies.items():
            shape = ours.slices[chips]
            assert (shape.topology, shape.machine_type, shape.num_nodes, shape.in_kinetic) == (
                topo.topology, topo.machine_type, topo.num_nodes, True,
            )  # fmt: skip
        assert {c for c, s in ours.slices.items() if s.in_kinetic} == set(spec.topologies)
    for alias, name in kinetic.TPU_ALIASES.items():
        assert parse_accelerator(f"tpu:{alias}").name == name


def test_every_string_kinetic_accepts_means_the_same_hardware(kinetic: Any) -> None:
    accepted = rejected = 0
    mismatches: list[str] = []
    for spec in dict.fromkeys(spellings(kinetic)):
        for text in variants(spec):
            try:
                theirs = kinetic.parse_accelerator(text)
            except ValueError:
                rejected += 1
                continue
            accepted += 1
            try:
                same_hardware(parse_accelerator(text), theirs)
            except (AssertionError, InvalidAcceleratorError) as exc:
                mismatches.append(f"{text!r}: kinetic {theirs!r}; ours: {exc}")
    assert not mismatches, "\n".join(mismatches[:20])
    # The walk reached both sides of kinetic's parser (not a vacuous pass).
    assert accepted > 2000 and rejected > 1000, (accepted, rejected)
