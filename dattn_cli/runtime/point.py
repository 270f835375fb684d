"""One call measured in this process, the way bench and profile both measure: its time, and its peak memory.

Time (`call_seconds`): on CUDA between two events on the device's stream, after a synchronize so that earlier
work is not counted, and a synchronize after; on the CPU by the monotonic performance counter.

Peak memory on the CPU: the process's peak RSS (VmHWM) reset to its current RSS first (runtime.measure), then
read after the work, so no peak is missed between samples. `peak_of_one_call` is bench's: one call, with freed
memory returned to the OS first (runtime.measure.return_freed_memory), above the worker's start-up RSS.
`PeakRss` is profile's: the peak over a block of calls above the RSS at its start, in the allocator's timing
state (what glibc keeps from earlier calls is reused without raising RSS). On CUDA both read the allocator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .measure import peak_rss_bytes, reset_peak_rss, return_freed_memory, rss_bytes


def call_seconds(run: Callable[[], Any], device: Any = "cpu") -> float:
    """Seconds one call of `run` takes on `device` (a torch device or its name): CUDA events on CUDA."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        began = time.perf_counter()
        run()
        return time.perf_counter() - began
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3


def peak_of_one_call(step: Callable[[], Any], base_rss: int, returns_memory: bool) -> tuple[int, bool]:
    """Peak RSS above base_rss of one more call, and whether it is exact (freed memory returned to the OS and
    the peak reset first); not exact: the process's peak so far, no call made."""
    exact = returns_memory and return_freed_memory() and reset_peak_rss()
    if exact:
        step()
    return max(0, peak_rss_bytes() - base_rss), exact


class PeakRss:
    """The peak RSS over a `with` block: `baseline` (the RSS at its start), `peak`; both None where the peak
    cannot be reset (Linux < 4.0, a read-only /proc): the process's lifetime peak would not be the block's."""

    def __init__(self) -> None:
        self.baseline: int | None = None
        self.peak: int | None = None

    def __enter__(self) -> PeakRss:
        try:
            baseline = rss_bytes()
        except (OSError, ValueError, IndexError):
            return self
        if reset_peak_rss():
            self.baseline = baseline
        return self

    def __exit__(self, *exc: object) -> None:
        if self.baseline is not None:
            self.peak = max(peak_rss_bytes(), self.baseline)
