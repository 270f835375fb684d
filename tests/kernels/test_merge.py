"""The merge routine's torch code (the fallback of merge_fused.py) against float64 arithmetic."""

import pytest
import torch

from dattn_cli.kernels.merge import accumulate_, merge_partial_, merge_partials

NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def torch_code(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # CPU tensors: the fast path never applies


def merge64(out, lse, block_out, block_lse):
    """The merge in float64, written directly from its definition (docs/semantics.md)."""
    out, lse, block_out, block_lse = (x.double() for x in (out, lse, block_out, block_lse))
    new = torch.logaddexp(lse, block_lse)
    w_a = torch.where(lse == NEG_INF, 0.0, torch.exp(lse - new))
    w_b = torch.where(block_lse == NEG_INF, 0.0, torch.exp(block_lse - new))
    return w_a.unsqueeze(-1) * out + w_b.unsqueeze(-1) * block_out, new


def strided_case(dtype, seed=0):
    """Accumulators as strided views of larger tensors (every 3rd position, every 2nd head), with -inf rows
    in the accumulator, in the block, and in both."""
    g = torch.Generator().manual_seed(seed)
    out_full, lse_full = torch.randn(2, 30, 6, 8, generator=g), torch.randn(2, 30, 6, generator=g)
    out, lse = out_full[:, 1::3, ::2], lse_full[:, 1::3, ::2]
    lse[0, 0] = NEG_INF
    out[0, 0] = 0.0
    lse[1, :2, 0] = NEG_INF
    out[1, :2, 0] = 0.0
    block_out = torch.randn(out.shape, generator=g).to(dtype)
    block_lse = torch.randn(lse.shape, generator=g) * 4
    block_lse[0, 1] = NEG_INF
    block_out[0, 1] = 0.0
    block_lse[1, :2, 0] = NEG_INF  # both empty
    block_out[1, :2, 0] = 0.0
    return out_full, lse_full, out, lse, block_out, block_lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_merge_partial_in_place_matches_float64(dtype):
    out_full, lse_full, out, lse, block_out, block_lse = strided_case(dtype)
    untouched = out_full[:, ::3].clone()
    want_out, want_lse = merge64(out, lse, block_out, block_lse)
    merge_partial_(out, lse, block_out.clone(), block_lse)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.double(), want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-6, rtol=1e-6)
    assert (lse[1, :2, 0] == NEG_INF).all() and (out[1, :2, 0] == 0).all()
    assert torch.equal(out_full[:, ::3], untouched)  # rows outside the view are not written


def test_merge_partials_matches_float64_and_is_differentiable():
    _, _, out, lse, block_out, block_lse = strided_case(torch.float32, seed=1)
    a, b = out.clone().requires_grad_(), block_out.clone().requires_grad_()
    got, got_lse = merge_partials(a, lse, b, block_lse)
    want, want_lse = merge64(out, lse, block_out, block_lse)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_lse.double(), want_lse)
    got.sum().backward()
    assert not a.grad.isnan().any() and not b.grad.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_accumulate_adds_in_place_with_the_cast(dtype):
    acc_full = torch.randn(3, 10, 4, 8)
    acc = acc_full[:, 1::2, 1:3]
    value = torch.randn(acc.shape).to(dtype)
    want = acc.double() + value.double()
    accumulate_(acc, value)
    torch.testing.assert_close(acc.double(), want, atol=1e-6, rtol=1e-6)
