"""How much CPU other processes took while a point was timed, and whether that left room for its threads.

Measured here: with 2 torch threads on 2 cores, the interleaved ratio of two implementations moved from 0.45
to 0.59 under load that came and went (contention hits many small multi-threaded kernels harder than one
large one); with 1 thread it stayed within 2%. So the load that matters is the CPU other processes keep busy
on this process's CPUs while it runs, against the threads it runs: /proc/stat's busy time of the CPUs in
the affinity set, minus this process's own CPU time, over the wall time between two samples.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

PROC_STAT = "/proc/stat"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (steal: a hypervisor neighbour took it)
# /proc/stat and os.times() count whole clock ticks (10 ms at USER_HZ 100), so each counter of a window is off
# by up to a tick: on 2 CPUs up to 3 ticks, 0.3 CPU over 0.1 s. Measured here (another process spinning one
# CPU), 0.05 s windows read 0.6 to 1.2 CPUs, 0.1 s windows 0.9 to 1.2: below 0.1 s the figure is rounding.
MIN_WINDOW_S = 0.1
TOLERANCE = 0.25  # CPUs of other work tolerated beyond the free ones (daemons, the parent's polling, rounding)


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # time.monotonic()
    busy_s: float  # busy time of the CPUs this process may run on, all processes
    own_s: float  # this process's CPU time, all threads


def cpu_sample() -> CpuSample | None:
    """Now's sample; None where /proc/stat cannot be read or holds none of this process's CPUs (not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
        ticks = os.sysconf("SC_CLK_TCK")
        with open(PROC_STAT) as f:
            lines = f.read().splitlines()
        busy, seen = 0, 0
        for line in lines:
            name, *values = line.split() or [""]
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                busy += sum(int(values[i]) for i in BUSY_FIELDS if i < len(values))
                seen += 1
    except (OSError, AttributeError, ValueError):
        return None
    if not seen or ticks <= 0:
        return None
    times = os.times()
    return CpuSample(wall_s=time.monotonic(), busy_s=busy / ticks, own_s=times.user + times.system)


def others_busy_cpus(before: CpuSample, after: CpuSample, own_extra_s: float = 0.0) -> float | None:
    """CPUs of the affinity set kept busy by other processes between the samples, on average; `own_extra_s`:
    CPU time of processes that are not "other" (a distributed point's other ranks). None for a window shorter
    than MIN_WINDOW_S, which clock ticks cannot resolve."""
    wall = after.wall_s - before.wall_s
    if wall < MIN_WINDOW_S:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s) - own_extra_s
    return max(0.0, others / wall)


def contention_reason(others_cpus: float | None, threads: int, cpus: int) -> str | None:
    """A sentence when other processes left fewer free CPUs than the point's threads need (beyond TOLERANCE);
    None when they left room, or when either figure is unknown. More threads than CPUs need all of them: the
    oversubscription is the point's own, not other processes'."""
    if others_cpus is None or cpus < 1:
        return None
    needed = min(max(threads, 1), cpus)
    if others_cpus <= cpus - needed + TOLERANCE:
        return None
    return (
        f"other processes kept {others_cpus:.1f} of {_count(cpus, 'CPU')} busy while this point ran its "
        f"{_count(threads, 'torch thread')}, so its timings and ratios are not trustworthy: rerun on a quiet "
        f"machine or with fewer --threads"
    )


def measurement_threads(requested: int | None, world_size: int = 1) -> int:
    """Torch threads per point (per rank): `requested` when given, OMP_NUM_THREADS's when set (one process), else
    torch's default (one process) or the CPUs shared out over the ranks, but never every CPU this process may use
    while there are more CPUs than ranks: one stays free for the OS, the timer and the probes. Measured on a quiet
    2-vCPU VM: with 2 threads, identical runs differed by factors 0.57-1.79 per point (a multi-threaded kernel waits
    for its slowest thread, and how often the host holds a vCPU back differs between worker processes); with 1
    thread, 0.88-1.07 (benchmarks/RESULTS.md, "Noise")."""
    import torch

    if requested is not None:
        return requested
    if world_size == 1 and os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    per_rank = torch.get_num_threads() if world_size == 1 else max(1, cpus // world_size)
    if per_rank * world_size >= cpus > world_size:
        per_rank = max(1, (cpus - 1) // world_size)
    return per_rank


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages, rounded to 2 places; None where the system does not say."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None
