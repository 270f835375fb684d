"""The CPU peak-memory method of bench: a peak measured after reset_peak_rss covers only what ran since,
and after return_freed_memory glibc serves tensors from mappings it gives back on free."""

import subprocess
import sys

import pytest

CHILD = """
import torch
from dattn_cli.runtime.measure import peak_rss_bytes, reset_peak_rss, return_freed_memory, rss_bytes

assert return_freed_memory()
tensors = [torch.ones(2 * 2**20) for _ in range(8)]  # 64 MiB, touched, then freed
del tensors
base = rss_bytes()
assert reset_peak_rss()
small = torch.ones(4 * 2**20)  # 16 MiB
print((rss_bytes() - base) / 2**20, (peak_rss_bytes() - base) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc are Linux's")
def test_peak_after_a_reset_is_the_memory_in_use_since():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    now, peak = map(float, done.stdout.split())
    assert now == pytest.approx(16, abs=4)  # the freed 64 MiB went back to the OS: 16 MiB is new RSS
    assert peak == pytest.approx(16, abs=4)  # and the earlier 64 MiB peak is forgotten
