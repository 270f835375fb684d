"""Peak memory over a setting: CUDA allocator statistics, or the peak resident set size on the CPU (runtime.point)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..runtime.point import PeakRss
from .report import CudaAllocatorStats, MemoryStats, TimeStats

CPU_MEMORY_METHOD = (
    "CPU: the process's peak resident set size (VmHWM) over the setting's warm-up and timed iterations, reset to "
    "the current RSS just before the setting's first call (runtime.point.PeakRss, the probe bench uses); "
    "peak_above_baseline_bytes = that peak minus the RSS at the reset. Heap pages the allocator kept from an "
    "earlier setting are reused without raising RSS, so a later setting can read lower "
    "(one unmeasured priming call before the first setting keeps one-time library set-up out of both)."
)
CUDA_MEMORY_METHOD = (
    "CUDA: torch.cuda.max_memory_allocated() after torch.cuda.reset_peak_memory_stats() at the start of the "
    "setting; peak_above_baseline_bytes = that peak minus torch.cuda.memory_allocated() at the start; "
    "cuda_allocator summarises torch.cuda.memory_stats() over the setting."
)
CPU_UNMEASURED = "CPU: not measured; the peak RSS cannot be reset here (/proc/self/clear_refs, Linux >= 4.0)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(run: Callable[[], TimeStats], device: torch.device) -> tuple[TimeStats, MemoryStats]:
    """Run `run` (warm-up + timed iterations) while measuring peak memory the way the device allows."""
    if device.type == "cuda":
        return _measure_cuda(run, device)
    return _measure_cpu(run)


def _memory(method: str, baseline: int | None, peak: int | None, allocator: CudaAllocatorStats | None = None):
    above = None if peak is None else peak - baseline
    return MemoryStats(
        memory_method=method,
        baseline_bytes=baseline,
        peak_bytes=peak,
        peak_above_baseline_bytes=above,
        cuda_allocator=allocator,
    )


def _measure_cuda(run: Callable[[], TimeStats], device: torch.device) -> tuple[TimeStats, MemoryStats]:
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    times = run()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    stats = torch.cuda.memory_stats(device)
    keys = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms")
    allocator = CudaAllocatorStats(**{key.replace(".", "_"): stats.get(key, 0) for key in keys})
    return times, _memory(CUDA_MEMORY_METHOD, baseline, peak, allocator)


def _measure_cpu(run: Callable[[], TimeStats]) -> tuple[TimeStats, MemoryStats]:
    with PeakRss() as rss:
        times = run()
    if rss.peak is None:
        return times, _memory(CPU_UNMEASURED, None, None)
    return times, _memory(CPU_MEMORY_METHOD, rss.baseline, rss.peak)
