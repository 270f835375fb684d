"""The memory model's tensor items against what torch actually allocates (every storage, while alive)."""

import pytest
import torch
import torch.nn.functional as F

from dattn_cli.kernels import REGISTRY, reset_global_memory_pool
from dattn_cli.runtime.measure import LiveTensorBytes
from dattn_cli.plan.memory import estimate_memory
from dattn_cli.workload import Problem

CONFIGS = [([512, 1024, 2048], [1, 2, 4], 2048), ([512, 2048], [1, 2], 2048), ([256, 1024], [2, 4], 1024)]


def live_peak(impl, n, mode, segs, rates):
    reset_global_memory_pool()
    module = None if impl == "sdpa" else REGISTRY[impl].cls(segs, rates)
    with LiveTensorBytes() as tracker:
        q, k, v = (torch.randn(1, n, 8, 64, requires_grad=mode == "fwdbwd") for _ in range(3))
        t = lambda a: a.transpose(1, 2)  # noqa: E731
        run = (lambda: t(F.scaled_dot_product_attention(t(q), t(k), t(v)))) if impl == "sdpa" else (lambda: module(q, k, v))
        if mode == "fwd":
            with torch.no_grad():
                run()
        else:
            out = run()
            out.backward(torch.ones_like(out))
    return tracker.peak


@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("impl", ["ImprovedDilatedAttention", "DilatedAttention", "sdpa"])
@pytest.mark.parametrize("segs, rates, n", CONFIGS)
def test_tensor_items_match_live_tensor_bytes(impl, mode, segs, rates, n):
    model = estimate_memory(Problem(impl=impl, seq_len=n, segment_lengths=segs, dilation_rates=rates, mode=mode))
    tensors = model.total - model.items.get("kernel workspace", 0)
    measured = live_peak(impl, n, mode, segs, rates)
    assert abs(tensors - measured) <= 0.12 * measured, (tensors, measured)


def test_items_are_itemised_and_sum():
    m = estimate_memory(Problem(impl="RingDilatedAttention", seq_len=65536, world_size=4,
                              segment_lengths=[2048, 8192, 32768], dilation_rates=[1, 2, 8], mode="fwdbwd"), 10)
    assert m.total == sum(m.items.values())
    assert m.items["comm buffers"] > 0 and m.items["framework"] == 10
