"""Local GPUs: which NVIDIA GPUs this machine has, and which of them a job may use.

On GKE a ``gpu-l4x2`` pod gets two L4s of its own from the scheduler; locally the
backend does the same for jobs that are separate processes, possibly started by
separate Airflow workers.  This module is the part that needs the package:

- what the machine has: the injected list ``KINETIC_LOCAL_GPUS`` (tests, or a person
  who wants to hand the backend fewer devices), else NVML (``pynvml``, from the
  ``gpu`` extra ``nvidia-ml-py``), else the ``/dev/nvidiaN`` nodes with their models
  unknown (so a machine without the extra keeps running GPU jobs on its GPUs);
- which of them a job may use: the devices whose model (NVML's name through
  :data:`MODEL_PATTERNS`) is the job's catalog GPU, checked in
  ``LocalBackend.preflight`` before anything is uploaded, so the error names what
  the machine has.

The assignment itself happens when the job starts, in its supervisor
(``supervise.py``, which imports nothing of the package): it ``flock``s one lock
file per device in a machine-wide directory and holds them for the job's whole
life, so a job that is SIGKILLed frees its devices (the kernel drops the locks),
and a job that finds too few free stays PENDING ("queued") until they are.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

from airflow_provider_kinetic.core.backends.local.supervise import (
    ASSIGNED_FILE,
    GPUS_FILE,
    HOST_TMPDIR_ENV,
    QUEUED_FILE,
)
from airflow_provider_kinetic.core.catalog.accelerators import GPU_TYPES, Accelerator
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport

log = logging.getLogger(__name__)

#: The machine's GPUs by name, used instead of NVML when set: a JSON list or
#: comma-separated names (NVML's or the catalog's); empty means "no GPUs".
GPUS_ENV = "KINETIC_LOCAL_GPUS"
#: The machine-wide lock directory (default ``{host temp dir}/kinetic-gpus``).
LOCKS_ENV = "KINETIC_LOCAL_GPU_LOCKS"
#: Every local GPU job's env: CUDA numbers devices fastest-first by default, NVML by
#: PCI bus; with this the indices in ``CUDA_VISIBLE_DEVICES`` mean NVML's devices.
GPU_JOB_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "JAX_PLATFORMS": "cuda"}

#: NVML device names -> catalog GPU names; first match wins, case ignored, and a row
#: counts only while the catalog has its name.  NVML says e.g. "NVIDIA H100 80GB
#: HBM3", "NVIDIA L4", "Tesla T4", "NVIDIA A100-SXM4-80GB"; ``\b`` keeps "L40S" from
#: being an L4, "P40" from being a P4 and "GB200" from being a B200.  Catalog names
#: match themselves ("l4", "rtx-pro-6000"; "h100-mega" is an h100, see SAME_CHIP).
MODEL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"\bGB200\b", "gb200"),
        (r"\bB200\b", "b200"),
        (r"\bH200\b", "h200"),
        (r"\bH100\b", "h100"),
        (r"\bRTX[\s-]+PRO[\s-]+6000\b", "rtx-pro-6000"),
        (r"\bA100\b.*\b80\s*GB\b", "a100-80gb"),
        (r"\bA100\b", "a100"),
        (r"\bL4\b", "l4"),
        (r"\bT4\b", "t4"),
        (r"\bV100\b", "v100"),
        (r"\bP100\b", "p100"),
        (r"\bP4\b", "p4"),
    )
)
#: Catalog GPUs that are another row's chip (GKE tells them apart by the machine's
#: network, NVML cannot): a device of the second serves a job asking for the first.
SAME_CHIP = {"h100-mega": "h100"}
#: What a ``/dev/nvidiaN`` device is called when there is no NVML to name it.
UNNAMED = "NVIDIA GPU (model unknown: no NVML; pip install 'airflow-provider-kinetic[gpu]')"
_BARE = re.compile(r"^\s*(gpu([:-]\d+)?|\d+)\s*(:spot)?\s*$", re.IGNORECASE)


class LocalGpuError(KineticError, ValueError):
    """A GPU job this machine cannot run: the message names what the machine has."""


@dataclass(frozen=True)
class LocalGpu:
    """One device: its NVML index, its name and the catalog model it is (if any)."""

    index: int
    name: str
    model: str | None
    #: False when the model could not be read (no NVML): the device serves any model.
    checked: bool = True


def catalog_model(name: str) -> str | None:
    """The catalog's name for a device called ``name`` (NVML's), if the table knows it."""
    for pattern, model in MODEL_PATTERNS:
        if model in GPU_TYPES and pattern.search(name):
            return model
    return None


def parse_injected(text: str) -> tuple[LocalGpu, ...]:
    """``KINETIC_LOCAL_GPUS``: a JSON list or "name,name"; the position is the index."""
    text = text.strip()
    names = json.loads(text) if text.startswith("[") else text.split(",")
    names = [str(n).strip() for n in names if str(n).strip()]
    return tuple(LocalGpu(i, name, catalog_model(name)) for i, name in enumerate(names))


def read_nvml(nvml: Any) -> tuple[LocalGpu, ...]:
    """The devices NVML lists, in its index order (``nvml``: the ``pynvml`` module)."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append(LocalGpu(index, name, catalog_model(name)))
        return tuple(gpus)
    finally:
        nvml.nvmlShutdown()


@functools.cache
def _nvml_gpus() -> tuple[LocalGpu, ...] | None:
    """NVML's devices, read once per process; None when ``pynvml`` is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        return read_nvml(pynvml)
    except pynvml.NVMLError as exc:  # no driver: no GPU this process can use
        log.info("NVML found no usable NVIDIA GPU (%s)", exc)
        return ()


def _dev_gpus() -> tuple[LocalGpu, ...]:
    """``/dev/nvidiaN`` nodes, models unknown: what the machine has without NVML."""
    names = os.listdir("/dev") if os.path.isdir("/dev") else []
    found = sorted(int(n[6:]) for n in names if n.startswith("nvidia") and n[6:].isdigit())
    return tuple(LocalGpu(i, UNNAMED, None, checked=False) for i in found)


def machine_gpus() -> tuple[LocalGpu, ...]:
    """This machine's NVIDIA GPUs: the injected list, else NVML, else ``/dev``."""
    injected = os.environ.get(GPUS_ENV)
    if injected is not None:
        return parse_injected(injected)
    found = _nvml_gpus()
    return _dev_gpus() if found is None else found


def describe_machine(gpus: tuple[LocalGpu, ...] | list[LocalGpu]) -> str:
    """``"2x NVIDIA L4 (l4), 1x Tesla T4 (t4)"``: what error messages say the machine has."""
    if not gpus:
        return "no NVIDIA GPU"
    counts: dict[tuple[str, str | None], int] = {}
    for gpu in gpus:
        counts[gpu.name, gpu.model] = counts.get((gpu.name, gpu.model), 0) + 1
    return ", ".join(
        f"{n}x {name}" + (f" ({model})" if model else "") for (name, model), n in counts.items()
    )


def gpu_env(accelerator: Accelerator, machine_gpus: int) -> tuple[dict[str, str], str | None]:
    """A job's env for a machine with ``machine_gpus`` GPUs, and, for a GPU job, the
    line the task log shows.  Which devices a GPU job gets is decided when it starts
    (its supervisor sets ``CUDA_VISIBLE_DEVICES``); other jobs see none of them."""
    asked = accelerator.canonical
    if accelerator.kind != "gpu":
        return ({"CUDA_VISIBLE_DEVICES": ""} if machine_gpus else {}), None
    if machine_gpus:
        n = accelerator.count
        note = f"running {asked} job on {n} of this machine's {machine_gpus} GPU(s), its own"
        return dict(GPU_JOB_ENV), note + " while it runs"
    note = f"no GPU on this machine: running {asked} job on the CPU (no GPU assigned)"
    return {"JAX_PLATFORMS": "cpu"}, note


def is_bare(requested: str) -> bool:
    """Whether an ``accelerator=`` string names no model ("gpu", "gpu:2", "4"): the
    parser then picks one by kinetic's rule, and the local backend takes any model."""
    return bool(_BARE.match(requested))


@dataclass(frozen=True)
class GpuPlan:
    """What a job's supervisor locks: ``count`` of the devices ``indices``."""

    count: int
    indices: tuple[int, ...]
    #: The GKE label of the model, for messages ("" when any model serves).
    what: str

    def request(self, lock_dir: str) -> dict[str, Any]:
        """The supervisor's ``gpus.json``."""
        return {
            "count": self.count,
            "indices": list(self.indices),
            "what": self.what,
            "lock_dir": lock_dir,
        }


def plan_gpus(
    accelerator: Accelerator,
    gpus: tuple[LocalGpu, ...] | None = None,
    *,
    any_model: bool = False,
    fallback: bool = False,
) -> GpuPlan | None:
    """The devices a GPU job may take; None for other jobs or a machine without GPUs
    (they run on the CPU, as before).  ``any_model``: a bare count (:func:`is_bare`).
    ``fallback`` (at submit, after the preflight): any model when too few match.

    Raises:
        LocalGpuError: the machine lacks the model, or has fewer devices than asked.
    """
    if accelerator.kind != "gpu":
        return None
    gpus = machine_gpus() if gpus is None else gpus
    if not gpus:
        return None
    asked, count = accelerator.canonical, accelerator.count
    have = describe_machine(gpus)
    chip = SAME_CHIP.get(accelerator.name, accelerator.name)
    usable = [g for g in gpus if any_model or not g.checked or g.model == chip]
    if fallback and len(usable) < count:
        usable, any_model = list(gpus), True
    if not usable:
        models = sorted({g.model for g in gpus if g.model})
        size = min(GPU_TYPES[models[0]].counts) if models else 0
        hint = f"; ask for a model it has (gpu-{models[0]}x{size})" if models else ""
        raise LocalGpuError(f"this machine has {have}; asked for {asked}{hint}")
    if count > len(usable):
        kind = "" if any_model else f" {accelerator.name}"
        raise LocalGpuError(
            f"asked for {asked} ({count} GPUs) but this machine has {len(usable)}{kind}: {have}"
        )
    what = "" if any_model else str(accelerator.gke_label or accelerator.name)
    return GpuPlan(count, tuple(g.index for g in usable), what)


def lock_dir() -> str:
    """Where every local job of this machine locks its devices (one dir per machine:
    two connections with different roots must not hand out the same GPU)."""
    configured = os.environ.get(LOCKS_ENV)
    if configured:
        return os.path.abspath(configured)
    return os.path.join(os.environ.get(HOST_TMPDIR_ENV) or tempfile.gettempdir(), "kinetic-gpus")


def queued_report(jdir: str) -> StatusReport | None:
    """PENDING while a live GPU job's supervisor has not got its devices (its message
    says what it waits for); None once it has them, or for a job without GPUs."""
    if not os.path.exists(os.path.join(jdir, GPUS_FILE)):
        return None
    if os.path.exists(os.path.join(jdir, ASSIGNED_FILE)):
        return None
    try:
        with open(os.path.join(jdir, QUEUED_FILE)) as f:
            message = f.read().strip()
    except FileNotFoundError:
        message = ""
    if not message:  # not tried yet, or got them between the two reads
        if os.path.exists(os.path.join(jdir, ASSIGNED_FILE)):
            return None
        return StatusReport(JobStatus.PENDING, "starting")
    return StatusReport(JobStatus.PENDING, "queued", message)
