"""What else happened while a point was timed: the CPU other processes took during its timed calls
(runtime.contention) and, on CUDA, the GPU's clocks, temperature and throttle reasons before and after the
point (runtime.gpustate). Either can make a point's timings untrustworthy; the row says so (noisy, with the
reason) instead of reporting a shifted time or ratio as clean."""

from __future__ import annotations

import os
from typing import Any

from .config import Sweep


class Probes:
    """Made before a point's first call (the GPU's state then); `start()` before its warm-up and timed calls, the
    window other processes' CPU is measured over (a longer window than the timed calls alone: /proc/stat counts
    10 ms ticks); `fields()` after."""

    def __init__(self, sweep: Sweep, group: Any = None):
        self.sweep, self.group = sweep, group
        self.gpu_before = self._gpu()
        self.cpu_before = None

    def _gpu(self) -> dict | None:
        if not self.sweep.cuda:
            return None
        import torch

        from ..runtime.gpustate import gpu_state

        return gpu_state(torch.cuda.current_device())

    def start(self) -> None:
        from ..runtime.contention import cpu_sample

        self.cpu_before = cpu_sample()

    def fields(self) -> dict:
        """other_cpus, contended (+ the reason as 'contention'); on CUDA gpu_before/gpu_after, throttled
        (+ 'throttle')."""
        result = self._cpu_fields()
        if self.sweep.cuda:
            from ..runtime.gpustate import throttle_reason

            after = self._gpu()
            reason = throttle_reason(self.gpu_before, after)
            result.update(gpu_before=self.gpu_before, gpu_after=after, throttled=reason is not None, throttle=reason)
        return result

    def _cpu_fields(self) -> dict:
        import torch

        from ..runtime.contention import contention_reason, cpu_sample, others_busy_cpus

        after = cpu_sample()
        if self.cpu_before is None or after is None:
            return {"other_cpus": None, "contended": False}
        world, own_extra = 1, 0.0
        if self.group is not None:  # the other ranks are not "other processes"
            world = torch.distributed.get_world_size(self.group)
            mine = torch.tensor([after.own_s - self.cpu_before.own_s], dtype=torch.float64)
            torch.distributed.all_reduce(mine, group=self.group)
            own_extra = float(mine.item()) - (after.own_s - self.cpu_before.own_s)
        others = others_busy_cpus(self.cpu_before, after, own_extra)
        threads = world * (1 if self.sweep.cuda else torch.get_num_threads())  # CUDA: one launching thread a rank
        reason = contention_reason(others, threads, len(os.sched_getaffinity(0)))
        return {"other_cpus": others, "contended": reason is not None, "contention": reason}
