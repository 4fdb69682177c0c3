"""Local GPUs without a GPU: NVML names to catalog models, what a machine can run and
the error naming what it has, the NVML seam (a fake module), the injected device list,
and the supervisor's all-or-nothing device locks (real ``flock``s in a temp dir)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local import gpus as local_gpus
from airflow_provider_kinetic.core.backends.local import slot_queue, supervise
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.backends.local.gpus import (
    GPU_JOB_ENV,
    GPUS_ENV,
    LocalGpu,
    LocalGpuError,
    catalog_model,
    describe_machine,
    gpu_env,
    is_bare,
    machine_gpus,
    parse_injected,
    plan_gpus,
    queued_report,
    read_nvml,
)
from airflow_provider_kinetic.core.catalog.accelerators import (
    GPU_TYPES,
    Accelerator,
    parse_accelerator,
)
from airflow_provider_kinetic.core.spec.handles import JobStatus, StatusReport

# ---- the name table ----------------------------------------------------------------


@pytest.mark.parametrize(
    "nvml_name, model",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("NVIDIA T4", "t4"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("Tesla P4", "p4"),
        # near misses: other GPUs whose names contain a catalog name
        ("NVIDIA L40S", None),
        ("NVIDIA L40", None),
        ("Tesla P40", None),
        ("NVIDIA A10", None),
        ("NVIDIA A10G", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA RTX 6000 Ada Generation", None),
        # newer rows, where the catalog has them
        ("NVIDIA H200", "h200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
    ],
)
def test_nvml_names_map_to_catalog_models(nvml_name: str, model: str | None) -> None:
    if model is not None and model not in GPU_TYPES:
        pytest.skip(f"the catalog has no {model!r}")
    assert catalog_model(nvml_name) == model


def test_every_catalog_gpu_can_run_on_a_machine_of_its_name() -> None:
    """A model added to the catalog without a row here could never run locally; a
    machine injected by catalog names has that model (h100-mega: an H100's chip)."""
    for name, gpu in GPU_TYPES.items():
        assert catalog_model(name.upper()) == local_gpus.SAME_CHIP.get(name, name)
        count = min(gpu.counts)
        accel = Accelerator(kind="gpu", name=name, count=count, gke_label=gpu.gke_label)
        plan = plan_gpus(accel, parse_injected(",".join([name] * count)))
        assert plan is not None and plan.indices == tuple(range(count)), name


def test_rows_for_models_the_catalog_lacks_are_inactive(monkeypatch) -> None:
    monkeypatch.delitem(GPU_TYPES, "h100")
    assert catalog_model("NVIDIA H100 80GB HBM3") is None


# ---- what the machine has ------------------------------------------------------------


def test_injected_lists_json_or_commas() -> None:
    assert parse_injected('["NVIDIA L4", "Tesla T4"]') == (
        LocalGpu(0, "NVIDIA L4", "l4"),
        LocalGpu(1, "Tesla T4", "t4"),
    )
    assert parse_injected(" l4, NVIDIA H100 80GB HBM3 ,") == (
        LocalGpu(0, "l4", "l4"),
        LocalGpu(1, "NVIDIA H100 80GB HBM3", "h100"),
    )
    assert parse_injected("") == parse_injected("[]") == ()


def test_the_injected_list_replaces_nvml(monkeypatch) -> None:
    def no_nvml():
        raise AssertionError("NVML asked although a list was injected")

    monkeypatch.setattr(local_gpus, "_nvml_gpus", no_nvml)
    monkeypatch.setenv(GPUS_ENV, "NVIDIA L4,NVIDIA L4")
    assert [g.model for g in machine_gpus()] == ["l4", "l4"]
    monkeypatch.setenv(GPUS_ENV, "")  # set but empty: a machine without GPUs
    assert machine_gpus() == ()


class FakeNvml:
    """The part of ``pynvml`` the backend uses, over a fixed device list."""

    class NVMLError(Exception):
        pass

    def __init__(self, names: list, fail_init: bool = False) -> None:
        self.names, self.fail_init = names, fail_init
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str | bytes:
        return self.names[handle[1]]


def test_read_nvml_lists_devices_in_index_order() -> None:
    nvml = FakeNvml(["NVIDIA H100 80GB HBM3", b"NVIDIA L4"])  # old bindings return bytes
    assert read_nvml(nvml) == (
        LocalGpu(0, "NVIDIA H100 80GB HBM3", "h100"),
        LocalGpu(1, "NVIDIA L4", "l4"),
    )
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_module_seam(monkeypatch) -> None:
    """``pynvml`` imported on demand: a fake in its place is read; a driver NVML cannot
    load means no GPU; no ``pynvml`` at all falls back to ``/dev/nvidiaN``."""
    monkeypatch.delenv(GPUS_ENV, raising=False)
    local_gpus._nvml_gpus.cache_clear()
    try:
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(["Tesla T4"]))
        assert machine_gpus() == (LocalGpu(0, "Tesla T4", "t4"),)
        local_gpus._nvml_gpus.cache_clear()
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(["Tesla T4"], fail_init=True))
        assert machine_gpus() == ()
        local_gpus._nvml_gpus.cache_clear()
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
        monkeypatch.setattr(local_gpus, "_dev_gpus", lambda: (LocalGpu(0, "dev", None, False),))
        assert machine_gpus() == (LocalGpu(0, "dev", None, False),)
    finally:
        local_gpus._nvml_gpus.cache_clear()


def test_describe_machine() -> None:
    gpus = parse_injected("NVIDIA L4,NVIDIA L4,Tesla T4,NVIDIA GeForce RTX 4090")
    assert describe_machine(gpus) == (
        "2x NVIDIA L4 (l4), 1x Tesla T4 (t4), 1x NVIDIA GeForce RTX 4090"
    )
    assert describe_machine(()) == "no NVIDIA GPU"


# ---- what a job may use -------------------------------------------------------------------

TWO_L4 = parse_injected("NVIDIA L4,NVIDIA L4")


def _plan(accelerator: str, gpus=TWO_L4, **kwargs):
    return plan_gpus(parse_accelerator(accelerator), gpus, **kwargs)


def test_a_job_may_use_the_devices_of_its_model() -> None:
    gpus = parse_injected("Tesla T4,NVIDIA L4,Tesla T4,NVIDIA L4")
    plan = _plan("gpu-l4x2", gpus)
    assert (plan.count, plan.indices, plan.what) == (2, (1, 3), "nvidia-l4")
    assert plan.request("/locks") == {
        "count": 2,
        "indices": [1, 3],
        "what": "nvidia-l4",
        "lock_dir": "/locks",
    }
    assert _plan("t4", gpus).indices == (0, 2)


def test_a_model_the_machine_lacks_names_what_it_has() -> None:
    with pytest.raises(LocalGpuError) as err:
        _plan("gpu-h100x1")
    assert str(err.value) == (
        "this machine has 2x NVIDIA L4 (l4); asked for gpu-h100x1; "
        "ask for a model it has (gpu-l4x1)"
    )
    assert isinstance(err.value, ValueError)  # what the backend registry passes on


def test_more_than_the_machine_has_names_the_count() -> None:
    with pytest.raises(LocalGpuError, match=r"asked for gpu-l4x4 \(4 GPUs\) but this machine "
                       r"has 2 l4: 2x NVIDIA L4 \(l4\)"):  # fmt: skip
        _plan("gpu-l4x4")
    with pytest.raises(LocalGpuError, match=r"\(4 GPUs\) but this machine has 2: 2x NVIDIA L4"):
        _plan("gpu:4", any_model=True)


def test_a_bare_count_takes_any_model() -> None:
    """``gpu:2`` parses to kinetic's pick (h100x2); told it was bare, any model serves."""
    assert parse_accelerator("gpu:2").name == "h100"
    plan = _plan("gpu:2", any_model=True)
    assert (plan.count, plan.indices, plan.what) == (2, (0, 1), "")
    assert [is_bare(s) for s in ("gpu", "GPU:2", "gpu-4", "8", "gpu:1:spot")] == [True] * 5
    assert [is_bare(s) for s in ("gpu-l4", "l4:2", "gpu-h100x2", "tpu-v5e-4", "cpu")] == [False] * 5


def test_the_submit_fallback_takes_any_model_only_when_too_few_match() -> None:
    gpus = parse_injected("NVIDIA L4,Tesla T4")
    assert _plan("gpu-l4", gpus, fallback=True).indices == (0,)
    assert _plan("gpu-h100x2", gpus, fallback=True).indices == (0, 1)
    with pytest.raises(LocalGpuError, match="4 GPUs"):
        _plan("gpu-l4x4", gpus, fallback=True)


def test_devices_nvml_could_not_name_serve_any_model() -> None:
    gpus = (LocalGpu(0, local_gpus.UNNAMED, None, checked=False),)
    assert _plan("gpu-h100x1", gpus).indices == (0,)
    with pytest.raises(LocalGpuError, match="pip install 'airflow-provider-kinetic\\[gpu\\]'"):
        _plan("gpu-h100x2", gpus)


def test_other_jobs_and_gpu_less_machines_get_no_plan() -> None:
    assert _plan("cpu") is None
    assert _plan("tpu-v5e-4") is None
    assert _plan("gpu-h100x8", ()) is None  # runs on the CPU, as before


def test_preflight_is_the_check_before_upload(monkeypatch) -> None:
    monkeypatch.setenv(GPUS_ENV, "NVIDIA L4,NVIDIA L4")
    LocalBackend.preflight(parse_accelerator("gpu-l4x2"))
    with pytest.raises(LocalGpuError, match="2x NVIDIA L4"):
        LocalBackend.preflight(parse_accelerator("gpu:2"))
    LocalBackend.preflight(parse_accelerator("gpu:2"), requested="gpu:2")
    monkeypatch.setenv(GPUS_ENV, "")
    LocalBackend.preflight(parse_accelerator("gpu-h100x8"))


def test_job_env_for_the_machine() -> None:
    env, note = gpu_env(parse_accelerator("gpu-l4x2"), 4)
    assert env == GPU_JOB_ENV == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "JAX_PLATFORMS": "cuda"}
    assert note == "running gpu-l4x2 job on 2 of this machine's 4 GPU(s), its own while it runs"
    env, note = gpu_env(parse_accelerator("gpu-l4x2"), 0)
    assert env == {"JAX_PLATFORMS": "cpu"}
    assert note == "no GPU on this machine: running gpu-l4x2 job on the CPU (no GPU assigned)"
    assert gpu_env(parse_accelerator("cpu"), 2) == ({"CUDA_VISIBLE_DEVICES": ""}, None)
    assert gpu_env(parse_accelerator("cpu"), 0) == ({}, None)


def test_lock_dir_is_machine_wide_unless_configured(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(local_gpus.LOCKS_ENV, raising=False)
    monkeypatch.setenv(supervise.HOST_TMPDIR_ENV, str(tmp_path))
    assert local_gpus.lock_dir() == str(tmp_path / "kinetic-gpus")
    monkeypatch.setenv(local_gpus.LOCKS_ENV, str(tmp_path / "mine"))
    assert local_gpus.lock_dir() == str(tmp_path / "mine")


# ---- the supervisor's locks ----------------------------------------------------------------


def test_locks_are_all_or_nothing(tmp_path: Path) -> None:
    locks = str(tmp_path / "locks")
    slot_queue.make_shared_dir(locks)
    assert os.stat(locks).st_mode & 0o7777 == 0o1777
    first, free = supervise._try_lock(locks, [0, 1, 2], 1)
    assert [i for i, _ in first] == [0] and free == 1
    # Two of three free: a job needing three gets none of them (and holds nothing).
    none, free = supervise._try_lock(locks, [0, 1, 2], 3)
    assert none == [] and free == 2
    both, _ = supervise._try_lock(locks, [0, 1, 2], 2)
    assert [i for i, _ in both] == [1, 2]
    for _, fd in first + both:
        os.close(fd)  # what the kernel does when a job dies
    again, _ = supervise._try_lock(locks, [0, 1, 2], 3)
    assert [i for i, _ in again] == [0, 1, 2]
    for _, fd in again:
        os.close(fd)


def test_acquire_records_the_assignment(tmp_path: Path, capsys) -> None:
    jdir = tmp_path / "job"
    jdir.mkdir()
    request = {"count": 2, "indices": [3, 5], "what": "nvidia-l4", "lock_dir": str(tmp_path / "l")}
    (jdir / supervise.GPUS_FILE).write_text(json.dumps(request))
    assert queued_report(str(jdir)) == StatusReport(JobStatus.PENDING, "starting")
    (jdir / supervise.QUEUED_FILE).write_text("waiting for 2 free nvidia-l4 GPUs (1 of 2 free)")
    assert queued_report(str(jdir)) == StatusReport(
        JobStatus.PENDING, "queued", "waiting for 2 free nvidia-l4 GPUs (1 of 2 free)"
    )
    devices, fds = supervise.acquire_gpus(str(jdir), request)
    try:
        assert devices == [3, 5]
        assert (jdir / supervise.ASSIGNED_FILE).read_text() == "3,5"
        assert not (jdir / supervise.QUEUED_FILE).exists()
        assert queued_report(str(jdir)) is None
        assert "GPU(s) [3, 5] assigned" in capsys.readouterr().out
    finally:
        for fd in fds:
            os.close(fd)
    assert queued_report(str(tmp_path)) is None  # a job without GPUs


def test_a_bare_count_takes_any_model_the_machine_has_through_the_config(monkeypatch, tmp_path):
    """The accelerator string as the task wrote it reaches the preflight: ``gpu:2``
    (parsed as kinetic's H100 pick) runs on two L4s; a named model must be there."""
    from airflow_provider_kinetic.core.config import KineticConfig

    monkeypatch.setenv("KINETIC_LOCAL_GPUS", "NVIDIA L4,NVIDIA L4")
    config = KineticConfig(backend="local", root=str(tmp_path / "root"))
    assert config.backend_kind("gpu:2") == config.backend_kind("gpu") == "local"
    with pytest.raises(
        ValueError, match=r"this machine has 2x NVIDIA L4 \(l4\); asked for gpu-h100"
    ):
        config.backend_kind("gpu-h100")
    with pytest.raises(ValueError, match="4 GPUs"):
        config.backend_kind("gpu:4")
