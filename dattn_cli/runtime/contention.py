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

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (steal: a hypervisor neighbour took it)
MIN_WINDOW_S = 0.05  # /proc/stat counts in jiffies (10 ms at USER_HZ 100): shorter windows are mostly rounding
TOLERANCE = 0.25  # CPUs of other work tolerated beyond the free ones (daemons, the parent's polling, rounding)


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    busy_s: float  # busy time of the CPUs this process may run on, all processes
    own_s: float  # this process's CPU time, all threads


def cpu_sample() -> CpuSample | None:
    """Now's sample; None where /proc/stat cannot be read (not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except (OSError, AttributeError, ValueError):
        return None
    busy = 0
    for line in lines:
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            busy += sum(int(values[i]) for i in BUSY_FIELDS if i < len(values))
    times = os.times()
    return CpuSample(wall_s=time.monotonic(), busy_s=busy / ticks, own_s=times.user + times.system)


def others_busy_cpus(before: CpuSample, after: CpuSample, own_extra_s: float = 0.0) -> float | None:
    """CPUs of the affinity set kept busy by other processes between the samples, on average; `own_extra_s`:
    CPU time of processes that are not "other" (a distributed point's other ranks). None for a window too
    short to resolve."""
    wall = after.wall_s - before.wall_s
    if wall < MIN_WINDOW_S:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s) - own_extra_s
    return max(0.0, others / wall)


def contention_reason(others_cpus: float | None, threads: int, cpus: int) -> str | None:
    """A sentence when other processes left fewer free CPUs than the point's threads (beyond TOLERANCE)."""
    if others_cpus is None or others_cpus <= cpus - threads + TOLERANCE:
        return None
    plural = "s" if threads != 1 else ""
    return (f"other processes kept {others_cpus:.1f} of {cpus} CPUs busy while this point ran its {threads} torch "
            f"thread{plural}: its timings and ratios are not trustworthy; rerun on a quieter machine or with fewer "
            f"threads (OMP_NUM_THREADS)")


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages, rounded; None where the system does not say."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None
