"""One call measured as bench and profile both measure it (runtime/point.py): its seconds, and the peak RSS of a
block caught whole, a short-lived allocation included, which a sampling thread could miss."""

import subprocess
import sys
import time

import pytest

from dattn_cli.runtime.point import call_seconds

CHILD = """
import torch
from dattn_cli.runtime.point import PeakRss, peak_of_one_call
from dattn_cli.runtime.measure import return_freed_memory, rss_bytes

torch.ones(2**20).sum()  # one-time set-up (thread pools, kernels) before the block
with PeakRss() as rss:
    torch.ones(16 * 2**20).sum()  # 64 MiB for an instant, then freed
print((rss.peak - rss.baseline) / 2**20)
base = rss_bytes()
peak, exact = peak_of_one_call(lambda: torch.ones(8 * 2**20).sum(), base, return_freed_memory())
print(peak / 2**20, exact)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc are Linux's")
def test_the_peak_of_a_block_and_of_one_call_include_a_short_lived_tensor():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    block, (call, exact) = float(done.stdout.split()[0]), done.stdout.split()[1:]
    assert block == pytest.approx(64, abs=8)
    assert exact == "True" and float(call) == pytest.approx(32, abs=8)


def test_call_seconds_times_the_call_on_the_cpu():
    assert 0.05 <= call_seconds(lambda: time.sleep(0.05)) < 5
    assert call_seconds(lambda: None, "cpu") < 0.05


def test_call_seconds_on_cuda_synchronizes():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.randn(2048, 2048, device="cuda")
    assert call_seconds(lambda: x @ x, "cuda") > 0
