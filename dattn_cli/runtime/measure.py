"""Timers' statistics and memory probes shared by bench and profile: RSS, address space, glibc's handling of
freed memory, peak RSS, NVML's device-used bytes."""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Sequence

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc mallopt parameters (malloc.h)
RETURN_THRESHOLD = 64 * 1024
DEFAULT_MMAP_MAX = 65536  # glibc's default count of mappings malloc may hold
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the heap's top is returned only beyond 2 GiB free


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of an ascending sequence."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def rss_bytes(pid: int | str = "self", field: int = 1) -> int:
    """Resident set size of a process now, from /proc/<pid>/statm (Linux); field 0: its address-space size."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")


def vm_bytes() -> int:
    """Address-space size of this process now (what RLIMIT_AS limits)."""
    return rss_bytes("self", 0)


def return_freed_memory() -> bool:
    """Make glibc hand freed memory back to the OS from now on, and give back what it holds now.

    By default glibc keeps freed heap memory for reuse and raises its mmap threshold as large blocks are
    freed, so a process's RSS depends on the order of earlier allocations. After malloc_trim and a fixed
    64 KiB mmap threshold every tensor-sized allocation is its own mapping, unmapped when freed, and RSS
    follows the memory actually in use (the CPU analogue of the CUDA allocator's allocated bytes). Call it
    before the work allocates: large chunks already freed into the heap are reused, and stay resident.
    False where the C library is not glibc.
    """
    return _mallopt((M_MMAP_MAX, DEFAULT_MMAP_MAX), (M_MMAP_THRESHOLD, RETURN_THRESHOLD), trim=True)


def reuse_freed_memory() -> bool:
    """Undo return_freed_memory for timing, to the steady state of a long-running process: every allocation from
    the heap (no mmap) and the heap never trimmed, so after the first calls no timed call pays page faults for
    its tensors. Measured in fresh processes (attention at N=4096, 1 thread, 256 MiB of scores a call): under
    glibc's own limits (mmap above 32 MiB, trim above 64 MiB) each call faulted its large tensors in again,
    841-1174 ms over 8 processes; with no mmap and no trim 374-449 ms. False where the C library is not glibc."""
    return _mallopt((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM))


def _mallopt(*settings: tuple[int, int], trim: bool = False) -> bool:
    """glibc's mallopt(parameter, value) for each setting in turn, after malloc_trim(0) with `trim`; whether all
    took. False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        if trim:
            libc.malloc_trim(0)
        return all(libc.mallopt(parameter, value) for parameter, value in settings)
    except (OSError, AttributeError):
        return False


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM (resettable), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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


def nvml_used_bytes(index: int) -> int | None:
    """Device memory in use on torch's CUDA device `index` according to NVML (all processes); None where NVML is
    absent or unusable. The device is NVML's match of torch's (gpustate.nvml_device), not NVML's number `index`."""
    from .gpustate import nvml_device, with_nvml

    return with_nvml(lambda nvml: nvml.nvmlDeviceGetMemoryInfo(nvml_device(nvml, index)[0]).used)
