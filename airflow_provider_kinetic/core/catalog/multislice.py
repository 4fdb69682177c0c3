"""Which TPU slices GKE can join into one multi-slice (JAX "megascale") job.

``num_slices=N`` asks for N identical slices of the accelerator, joined over the
data-center network; the pods of all slices run one program (``core.backends.k8s``
builds them as one JobSet).  Checked when the options are made, so a DAG asking
for slices GKE cannot join fails at parse time naming what is allowed.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.catalog.accelerators import Accelerator, parse_accelerator

# TPU generations whose slices GKE joins as a Multislice.  Checked against
# https://cloud.google.com/tpu/docs/tpu-gke-multislice ("Multislice availability in
# GKE"): Multislice runs only on multi-host TPU slice node pools (not, e.g., v4 2x2x1
# or v5e 2x2, which are single-host), all slices of one type, size and topology, and
# not on TPU v3.  TPU7x is left out until that page names it.
MULTISLICE_TPUS = ("v4", "v5litepod", "v5p", "v6e")

#: The default: one slice (a Job, or a LeaderWorkerSet for a multi-host slice).
SINGLE_SLICE = 1


def check_num_slices(num_slices: Any, accelerator: str | Accelerator) -> int:
    """``num_slices`` as an int >= 1; more than one only for a multi-host TPU slice of
    a generation in :data:`MULTISLICE_TPUS` (the error names the value and what is allowed)."""
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(f"num_slices must be a whole number >= 1, got {num_slices!r}")
    if num_slices == SINGLE_SLICE:
        return num_slices
    accel = parse_accelerator(accelerator) if isinstance(accelerator, str) else accelerator
    allowed = (
        "multi-host TPU slices of "
        + ", ".join(MULTISLICE_TPUS)
        + " (for example 'tpu-v5p-2x2x4' or 'tpu-v6e-4x4'; GKE joins no others)"
    )
    if accel.kind != "tpu" or accel.name not in MULTISLICE_TPUS:
        raise ValueError(
            f"num_slices={num_slices} needs an accelerator GKE can join as a multi-slice; "
            f"{accel.canonical!r} is not one. Allowed: {allowed}"
        )
    if not accel.is_multi_host:
        raise ValueError(
            f"num_slices={num_slices}: {accel.canonical!r} is a single-host slice, which GKE "
            f"does not join as a multi-slice. Allowed: {allowed}"
        )
    return num_slices
