"""Limits a measuring process puts on itself, and how a failure is classified.

CPU: the worker caps its own address space (RLIMIT_AS) at its size when first capped plus headroom x the
memory cap plus a slack, so an allocation beyond the cap fails inside torch (a MemoryError-like
RuntimeError, status oom) long before the kernel's OOM killer would act.
"""

from __future__ import annotations

import os
import resource

from .measure import vm_bytes

RLIMIT_SLACK = 512 * 2**20
_BASE_VM: int | None = None
OOM_WORDS = ("can't allocate memory", "out of memory", "cannot allocate memory")


def cap_address_space(max_memory: int, headroom: float = 1.0) -> None:
    """Cap this process's address space at its size when first called plus headroom x max_memory (+ slack)."""
    global _BASE_VM
    if _BASE_VM is None:
        _BASE_VM = vm_bytes()
    limit = int(_BASE_VM + headroom * max_memory + RLIMIT_SLACK)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def cap_memory(max_memory: int, device: str) -> None:
    """The worker's memory cap: on CPU its address space (cap_address_space); on CUDA the caching allocator's
    share of the device (torch.cuda.set_per_process_memory_fraction), so that an allocation past --max-memory is a
    CUDA OOM row, as on a card of that size ("emulated": the rest of the card stays idle, its bandwidth does not)."""
    if not device.startswith("cuda"):
        cap_address_space(max_memory)
        return
    import torch

    index = torch.device(device).index or 0
    total = torch.cuda.get_device_properties(index).total_memory
    if max_memory < total:
        torch.cuda.set_per_process_memory_fraction(max_memory / total, index)


def address_space_capped() -> bool:
    """Whether this process capped itself (not so when a measurement runs in a caller's process)."""
    return _BASE_VM is not None


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    return any(word in str(exc).lower() for word in OOM_WORDS)


RANKS_PER_CORE = 4  # gloo ranks are processes: past a few per core they only wait on each other
MIN_RANK_LIMIT = 8


def max_spawned_ranks() -> int:
    """The most ranks dattn starts on this machine for one process group: RANKS_PER_CORE x the CPU cores
    (at least MIN_RANK_LIMIT), so a typo like --world-size 1000000 is refused instead of forking that many."""
    return max(MIN_RANK_LIMIT, RANKS_PER_CORE * (os.cpu_count() or 1))


def check_spawned_ranks(world_size: int, option: str = "--world-size", device: str = "cpu") -> None:
    """ValueError naming `option` when `world_size` ranks are more than this machine may spawn: on CUDA one GPU
    per rank (NCCL refuses two ranks on one device)."""
    if device.startswith("cuda"):
        import torch

        gpus = torch.cuda.device_count()
        if world_size > gpus:
            raise ValueError(
                f"{option} {world_size:,} on {device}: NCCL needs one GPU per rank and this machine has "
                f"{gpus}; use at most {gpus} ranks, or run under torchrun/srun across nodes"
            )
        return
    limit = max_spawned_ranks()
    if world_size > limit:
        raise ValueError(
            f"{option} {world_size:,}: at most {limit} ranks are spawned on this machine "
            f"({RANKS_PER_CORE} per CPU core, {os.cpu_count() or 1} cores); use fewer ranks, or "
            "'dattn plan --world-size' to plan for more devices"
        )


def available_memory_bytes() -> int | None:
    """Memory the kernel says can be allocated now without swapping (MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
