"""CUDA backends against the reference. Skipped cleanly where no CUDA device is present."""

import pytest
import torch

from dattn_cli.kernels import ImprovedDilatedAttention, dilated_attention_reference, kernel_choice
from dattn_cli.kernels.backends import flash_usable
from dattn_cli.kernels.block_kernels import kernels_used, reset_kernels_used
from dattn_cli.kernels.flash_kernels import flash_installs

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
@pytest.mark.parametrize("kernel", ["cudnn", "fa2", "fa4", "flash-attn2", "efficient", "math"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["view", "copy"])
def test_each_forced_block_kernel_cuda(monkeypatch, kernel, dtype, causal, layout):
    """DATTN_BLOCK_KERNEL forces each kernel in turn (what the GPU script does); DATTN_BLOCK_LAYOUT passes the
    r > 1 blocks as strided views or copies. Forward and gradients against the float64 reference."""
    if not kernel_choice.available(kernel):
        pytest.skip(f"{kernel} is not installed here")
    monkeypatch.setenv("DATTN_BLOCK_KERNEL", kernel)
    monkeypatch.setenv("DATTN_BLOCK_LAYOUT", layout)
    reset_kernels_used()
    _check("auto", dtype, causal)
    assert kernels_used() == kernel


@cuda
def test_the_probe_times_every_available_kernel_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DATTN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DATTN_BLOCK_KERNEL", raising=False)
    monkeypatch.setattr(kernel_choice, "_MEMO", {})
    monkeypatch.setattr(kernel_choice, "_CHOICE", {})
    kernel_choice.ensure_probed("cuda", "bfloat16", 64)
    (choice,) = kernel_choice.cached_choices()
    assert choice["timings_ms"]["fa2"] is not None, choice["errors"]
    assert choice["sdpa"] in ("cudnn", "fa2") and choice["auto"] is not None
    reset_kernels_used()
    _check("auto", torch.bfloat16, False)
    assert kernels_used() == choice["auto"]


@cuda
@pytest.mark.skipif(not flash_installs().fa4, reason="needs flash-attn-4")
@pytest.mark.parametrize("causal", [False, True])
def test_fa4_attention_cuda(causal):
    from dattn_cli.kernels.flash_kernels import fa4_attention

    base = [torch.randn(2, 300, 4, 64, dtype=torch.float64, device="cuda") for _ in range(3)]
    out, lse = fa4_attention(*(x.bfloat16() for x in base), causal=causal, scale=0.1)
    s = torch.einsum("bnhd,bmhd->bhnm", base[0], base[1]) * 0.1
    if causal:
        s = s.masked_fill(torch.ones(300, 300, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.einsum("bhnm,bmhd->bnhd", s.softmax(-1), base[2])
    assert (out.double() - ref).abs().max() < 2e-2 and (lse.double() - s.logsumexp(-1)).abs().max() < 2e-2


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
