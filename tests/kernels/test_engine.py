"""The engine's gather of r > 1 blocks: strided views where the kernel takes them, copies where it needs (or, on
CPU flash, prefers) them; DATTN_BLOCK_LAYOUT forces either, and both give the same result."""

import pytest
import torch

from dattn_cli.kernels import ImprovedDilatedAttention
from dattn_cli.kernels.backends import BACKENDS


def _run(backend, dtype, causal):
    torch.manual_seed(0)
    xs = [torch.randn(2, 96, 4, 16, dtype=dtype).requires_grad_() for _ in range(3)]
    module = ImprovedDilatedAttention([16, 32, 48], [1, 2, 3], backend=backend)
    out = module(*xs, is_causal=causal)
    grads = torch.autograd.grad(out, xs, torch.randn_like(out))
    return out, *grads


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_views_and_copies_of_dilated_blocks_give_the_same_result(monkeypatch, backend, dtype, causal):
    layouts = []
    target = BACKENDS[backend]
    forward, backward = target.forward, target.backward

    def spy_forward(q, k, v, key_pad, call):
        layouts.append(q.is_contiguous())
        return forward(q, k, v, key_pad, call)

    def spy_backward(dout, q, *rest):
        layouts.append(q.is_contiguous())
        return backward(dout, q, *rest)

    monkeypatch.setattr(target, "forward", spy_forward)
    monkeypatch.setattr(target, "backward", spy_backward)
    seen = {}
    results = {}
    for layout in ("view", "copy"):
        monkeypatch.setenv("DATTN_BLOCK_LAYOUT", layout)
        layouts.clear()
        results[layout] = _run(backend, dtype, causal)
        seen[layout] = list(layouts)
    # r > 1 blocks reached the kernel as strided views in one run and as contiguous copies in the other
    assert not all(seen["view"]) and seen["view"] != seen["copy"]
    assert sum(seen["copy"]) > sum(seen["view"])
    for a, b in zip(results["view"], results["copy"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("backend, kernel", [("math", "math"), ("sdpa", "cpu-flash"), ("auto", "cpu-flash")])
def test_the_kernels_a_call_ran_on_are_recorded(backend, kernel):
    from dattn_cli.kernels.block_kernels import kernels_used, reset_kernels_used

    reset_kernels_used()
    _run(backend, torch.float32, causal=False)
    assert kernels_used() == kernel
    reset_kernels_used()
    assert kernels_used() is None
