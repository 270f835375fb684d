"""`dattn env` as a library: what this machine offers for attention work."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
from pydantic import BaseModel

from .. import __version__
from ..kernels.flash_kernels import flash_installs
from ..kernels.kernel_choice import available as kernel_available, cached_choices, forced_kernel
from .contention import load_average
from .gpustate import nvml_ask, nvml_device, nvml_state


class Device(BaseModel):
    index: int  # NVML's (nvidia-smi's) number of the GPU on this machine, not torch's
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    cuda_index: int | None = None  # torch's cuda:N for this GPU in the recording process; None: not visible to it
    cuda_match: str | None = None  # how cuda_index was matched to this GPU (UUID, PCI bus id or only an index)
    sm_clock_mhz: int | None = None  # when the record was taken; with the power limit: what bounds its speed
    max_sm_clock_mhz: int | None = None
    power_limit_w: float | None = None


class EnvironmentInfo(BaseModel):
    dattn_version: str
    git_commit: str | None
    python: str
    platform: str
    cpu: str
    cpu_count: int | None
    torch_version: str
    cuda_version: str | None
    cuda_available: bool
    nvidia_driver: str | None
    nvidia_devices: list[Device]
    nvml_status: str
    backends: dict[str, bool]
    # the block kernels (kernels/kernel_choice.py): what DATTN_BLOCK_KERNEL forces (None: the probe) and the
    # probes cached for this torch, cuDNN and flash packages, each with its choice per backend, every kernel's
    # steady ms and its compile seconds (block_kernel_compile_s: the first call's extra time; FA4 compiles then)
    block_kernel_forced: str | None = None
    block_kernels: list[dict] | None = None
    # what decides whether two runs' timings are comparable (dattn compare reads these)
    hostname: str | None = None
    load_average: list[float] | None = None  # 1, 5, 15 minutes, when the record was taken
    cpu_affinity: list[int] | None = None  # the CPUs this process may run on
    governor: str | None = None  # cpufreq scaling governor of CPU 0, where readable
    torch_threads: int | None = None  # torch's intra-op threads in this process


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def comparability_facts() -> dict:
    """Host, load average, torch threads, CPU affinity and frequency governor: None where this system does not
    say."""

    def read(fn):
        try:
            return fn()
        except (OSError, AttributeError, ValueError):
            return None

    return {
        "hostname": platform.node() or None,
        "load_average": load_average(),
        "torch_threads": torch.get_num_threads(),
        "cpu_affinity": read(lambda: sorted(os.sched_getaffinity(0))),
        "governor": read(lambda: Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()),
    }


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _nvml() -> tuple[str | None, list[Device], str]:
    try:
        import pynvml
    except ImportError:
        return None, [], "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, [], f"no NVIDIA device ({exc})"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = _cuda_indices(pynvml)
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = _text(nvml_ask(pynvml, "nvmlDeviceGetUUID", handle))
            state = nvml_state(pynvml, handle)
            cuda_index, cuda_match = cuda.get(uuid, (None, None))
            devices.append(
                Device(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_total_bytes=mem.total,
                    memory_used_bytes=mem.used,
                    uuid=uuid,
                    pci_bus_id=_text(getattr(nvml_ask(pynvml, "nvmlDeviceGetPciInfo", handle), "busId", None)),
                    cuda_index=cuda_index,
                    cuda_match=cuda_match,
                    **{k: state[k] for k in ("sm_clock_mhz", "max_sm_clock_mhz", "power_limit_w")},
                )
            )
        return _text(driver), devices, f"{len(devices)} NVIDIA device(s)"
    finally:
        pynvml.nvmlShutdown()


def _cuda_indices(nvml) -> dict[str, tuple[int, str]]:
    """NVML UUID -> (torch's CUDA index, how it was matched) for every GPU torch sees (its count comes from NVML
    without starting CUDA); empty where torch has no CUDA."""
    try:
        count = torch.cuda.device_count()
    except Exception:
        return {}
    found = {}
    for cuda_index in range(count):
        try:
            handle, how = nvml_device(nvml, cuda_index)
            found.setdefault(_text(nvml.nvmlDeviceGetUUID(handle)), (cuda_index, how))
        except Exception:  # a device NVML cannot match stays without a CUDA index
            continue
    return found


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _backends() -> dict[str, bool]:
    installs = flash_installs()
    return {
        "math": True,
        "sdpa": hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
        "cudnn attention": torch.cuda.is_available() and kernel_available("cudnn"),
        "flash-attn 2": installs.fa2,
        "flash-attn 4 (flash_attn.cute)": installs.fa4,
        "triton": importlib.util.find_spec("triton") is not None,
        "flex_attention": importlib.util.find_spec("torch.nn.attention.flex_attention") is not None,
        "torch.distributed": torch.distributed.is_available(),
        "gloo": torch.distributed.is_available() and torch.distributed.is_gloo_available(),
        "nccl": torch.distributed.is_available() and torch.distributed.is_nccl_available(),
    }


def _block_kernels() -> dict:
    try:
        forced = forced_kernel()
    except ValueError as exc:
        forced = f"invalid: {exc}"
    return {"block_kernel_forced": forced, "block_kernels": cached_choices()}


def collect_environment() -> EnvironmentInfo:
    driver, devices, status = _nvml()
    return EnvironmentInfo(
        dattn_version=__version__,
        git_commit=_git_commit(),
        python=sys.version.split()[0],
        platform=platform.platform(),
        cpu=cpu_name(),
        cpu_count=os.cpu_count(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        nvidia_driver=driver,
        nvidia_devices=devices,
        nvml_status=status,
        backends=_backends(),
        **_block_kernels(),
        **comparability_facts(),
    )
