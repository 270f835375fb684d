"""Small measurement helpers shared by bench and profile."""

from __future__ import annotations

import os
from typing import Sequence


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of an ascending sequence."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process now, from /proc/<pid>/statm (Linux)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def vm_bytes() -> int:
    """Address-space size of this process now (what RLIMIT_AS limits)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class LiveTensorBytes:
    """Peak bytes of live tensor storages created inside the block (a TorchDispatchMode).

    Every op's output storage is counted once (views share it) until it is freed. This is what the
    planner's memory model is derived from and tested against; it does not see allocator caching,
    fragmentation or kernel-internal scratch, which the model adds as stated overheads.
    """

    def __init__(self):
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __enter__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        def track(t):
            import torch

            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                return
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or key in tracker._seen:
                return
            tracker._seen.add(key)
            size = storage.nbytes()
            tracker.live += size
            tracker.peak = max(tracker.peak, tracker.live)

            def freed(key=key, size=size):
                tracker.live -= size
                tracker._seen.discard(key)

            weakref.finalize(storage, freed)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    track(t)
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        return False
