"""Peak memory over a setting: CUDA allocator statistics, or resident set size sampled on the CPU."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ..runtime.measure import rss_bytes
from .report import CudaAllocatorStats, MemoryStats, TimeStats

RSS_SAMPLE_INTERVAL_S = 0.002
CPU_MEMORY_METHOD = (
    f"CPU: resident set size sampled from /proc/self/statm every {RSS_SAMPLE_INTERVAL_S * 1e3:g} ms by a "
    "background thread during warm-up and timed iterations; peak_above_baseline_bytes = peak RSS minus the RSS "
    "just before the setting's first call (the process's own peak RSS cannot be reset). Peaks shorter than "
    "the interval can be missed, and heap pages the allocator kept from an earlier setting are reused "
    "without raising RSS, so a later setting can read lower "
    "(one unmeasured priming call before the first setting keeps one-time library set-up out of both)."
)
CUDA_MEMORY_METHOD = (
    "CUDA: torch.cuda.max_memory_allocated() after torch.cuda.reset_peak_memory_stats() at the start of the "
    "setting; peak_above_baseline_bytes = that peak minus torch.cuda.memory_allocated() at the start; "
    "cuda_allocator summarises torch.cuda.memory_stats() over the setting."
)
CPU_UNMEASURED = "CPU: not measured; /proc/self/statm is not readable on this system"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RssSampler:
    """Peak RSS over a `with` block, sampled by a daemon thread (torch ops release the GIL)."""

    def __init__(self, interval_s: float = RSS_SAMPLE_INTERVAL_S):
        self.interval_s = interval_s
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self.samples = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dattn-rss-sampler", daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, rss_bytes())
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def measure(run: Callable[[], TimeStats], device: torch.device) -> tuple[TimeStats, MemoryStats]:
    """Run `run` (warm-up + timed iterations) while measuring peak memory the way the device allows."""
    if device.type == "cuda":
        return _measure_cuda(run, device)
    return _measure_cpu(run)


def _measure_cuda(run: Callable[[], TimeStats], device: torch.device) -> tuple[TimeStats, MemoryStats]:
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    times = run()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    stats = torch.cuda.memory_stats(device)
    allocator = CudaAllocatorStats(
        allocated_bytes_all_peak=stats.get("allocated_bytes.all.peak", 0),
        reserved_bytes_all_peak=stats.get("reserved_bytes.all.peak", 0),
        num_alloc_retries=stats.get("num_alloc_retries", 0),
        num_ooms=stats.get("num_ooms", 0),
    )
    memory = MemoryStats(
        memory_method=CUDA_MEMORY_METHOD,
        baseline_bytes=baseline,
        peak_bytes=peak,
        peak_above_baseline_bytes=peak - baseline,
        rss_samples=0,
        cuda_allocator=allocator,
    )
    return times, memory


def _measure_cpu(run: Callable[[], TimeStats]) -> tuple[TimeStats, MemoryStats]:
    try:
        sampler = RssSampler()
    except (OSError, ValueError, IndexError):
        return run(), MemoryStats(
            memory_method=CPU_UNMEASURED,
            baseline_bytes=None,
            peak_bytes=None,
            peak_above_baseline_bytes=None,
            rss_samples=0,
        )
    with sampler:
        times = run()
    memory = MemoryStats(
        memory_method=CPU_MEMORY_METHOD,
        baseline_bytes=sampler.baseline,
        peak_bytes=sampler.peak,
        peak_above_baseline_bytes=sampler.peak - sampler.baseline,
        rss_samples=sampler.samples,
    )
    return times, memory
