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
