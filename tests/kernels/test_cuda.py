"""CUDA backends against the reference. Skipped cleanly where no CUDA device is present."""

import pytest
import torch

from dattn_cli.kernels import ImprovedDilatedAttention, dilated_attention_reference
from dattn_cli.kernels.backends import flash_usable

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _check(backend, dtype, causal):
    segs, rates = [64, 128, 256], [1, 2, 4]
    base = [torch.randn(2, 500, 8, 64, dtype=torch.float64, device="cuda") for _ in range(4)]
    xs = [x.to(dtype).requires_grad_() for x in base[:3]]
    module = ImprovedDilatedAttention(segs, rates, backend=backend)
    out = module(*xs, is_causal=causal)
    grads = torch.autograd.grad(out, xs, base[3].to(dtype))
    rs = [x.clone().requires_grad_() for x in base[:3]]
    ref, _ = dilated_attention_reference(*rs, segs, rates, causal)
    ref_grads = torch.autograd.grad(ref, rs, base[3])
    hs = [x.to(dtype).requires_grad_() for x in base[:3]]
    naive, _ = dilated_attention_reference(*hs, segs, rates, causal, compute_dtype=dtype)
    naive_grads = torch.autograd.grad(naive, hs, base[3].to(dtype))
    for got, nv, r in [(out, naive, ref), *zip(grads, naive_grads, ref_grads)]:
        if dtype in (torch.float16, torch.bfloat16):
            assert (got.double() - r).abs().max() <= 2 * (nv.double() - r).abs().max() + 1e-3
        else:
            assert ((got.double() - r).abs().max() / r.abs().max()) <= 1e-4


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_cuda(dtype, causal):
    _check("sdpa", dtype, causal)


@cuda
@pytest.mark.skipif(not flash_usable("cuda"), reason="needs flash-attn")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_cuda(dtype, causal):
    _check("flash", dtype, causal)


@cuda
@pytest.mark.parametrize("pattern", ["local", "dilated", "global_local", "hierarchical", "longnet"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_flex_cuda_forward_and_backward(pattern, causal):
    """On CUDA `auto` runs compiled FlexAttention; forward, lse and gradients equal the block-masked
    reference (bf16 by the naive-error rule)."""
    from dattn_cli.kernels import BlockSparseRingDilatedAttention, block_sparse_reference

    options = (
        {"segment_lengths": [256, 512], "dilation_rates": [1, 2]}
        if pattern in ("dilated", "longnet")
        else {"window": 1}
    )
    module = BlockSparseRingDilatedAttention(pattern=pattern, block_size=128, **options)
    base = [torch.randn(1, 1000, 4, 64, dtype=torch.float64, device="cuda") for _ in range(4)]
    xs = [x.bfloat16().requires_grad_() for x in base[:3]]
    out, lse = module.forward_with_lse(*xs, causal)
    assert module.last_executor[0] == "flex", module.describe()
    grads = torch.autograd.grad(out, xs, base[3].bfloat16())
    table = module.block_table(1000, 4)
    rs = [x.clone().requires_grad_() for x in base[:3]]
    ref, ref_lse = block_sparse_reference(*rs, table, 128, causal)
    ref_grads = torch.autograd.grad(ref, rs, base[3])
    hs = [x.bfloat16().requires_grad_() for x in base[:3]]
    naive, _ = block_sparse_reference(*hs, table, 128, causal, compute_dtype=torch.bfloat16)
    naive_grads = torch.autograd.grad(naive, hs, base[3].bfloat16())
    assert (lse.double() - ref_lse.double()).abs().max() <= 1e-2
    for got, nv, r in [(out, naive, ref), *zip(grads, naive_grads, ref_grads)]:
        assert (got.double() - r).abs().max() <= 2 * (nv.double() - r).abs().max() + 1e-3
