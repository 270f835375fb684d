"""The CPU peak-memory method: freed memory goes back to the OS, so a peak is what is in use, not what
glibc kept from earlier allocations."""

import subprocess
import sys

import pytest

CHILD = """
import torch
from dattn_cli.measure import peak_rss_bytes, reset_peak_rss, return_freed_memory, rss_bytes

pins = []

def churn():
    tensors = [torch.ones(2 * 2**20) for _ in range(8)]  # 8 x 8 MiB, touched
    pins.append(torch.ones(1024))  # a small block above them keeps glibc from trimming the heap top
    del tensors

churn()  # mmapped and unmapped; glibc raises its mmap threshold above 8 MiB
churn()  # now on the heap, below a pin: freed but kept resident for reuse
if {returned}:
    assert return_freed_memory()
base = rss_bytes()
assert reset_peak_rss()
churn()
print((peak_rss_bytes() - base) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc are Linux's")
def test_a_peak_after_returning_freed_memory_is_the_memory_in_use():
    def peak_mib(returned: bool) -> float:
        done = subprocess.run([sys.executable, "-c", CHILD.format(returned=returned)], capture_output=True, text=True,
                              check=True)
        return float(done.stdout.strip().splitlines()[-1])

    assert peak_mib(True) == pytest.approx(64, rel=0.15)  # the 8 x 8 MiB, faulted in again
    assert peak_mib(False) < 32  # glibc's default: reused without new pages, the peak hides the use
