"""The token sliding window (kernels/block_sparse/window.py, pattern='sliding_window'): exact against the dense
band reference, forward, lse and gradients (causal, key padding, GQA, windows wider than the sequence, zero
windows); its pair count and block cover; one clear error for what it does not take."""

import pytest
import torch

from dattn_cli.kernels import BlockSparseRingDilatedAttention
from dattn_cli.kernels.block_sparse.patterns import BlockPattern, band_blocks
from dattn_cli.kernels.block_sparse.window import window_pairs
from tests.conftest import rel_err


def _module(left, right, **options):
    return BlockSparseRingDilatedAttention(
        pattern="sliding_window", block_size=8, window_left=left, window_right=right, **options
    )


@pytest.mark.parametrize("left, right", [(13, 5), (0, 0), (100, 3), (1, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_equals_the_band_reference(left, right, causal):
    g = torch.Generator().manual_seed(left + 7 * right + causal)
    q = torch.randn(2, 70, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 70, 2, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.rand(2, 70, generator=g) < 0.2
    module = _module(left, right)
    out, lse = module.forward_with_lse(q, k, v, causal, key_padding_mask=mask)
    ref, ref_lse = module.reference(q, k, v, causal, key_padding_mask=mask)
    assert rel_err(out, ref) <= 1e-12
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and rel_err(lse[finite].double(), ref_lse[finite].double()) <= 1e-6
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), up), torch.autograd.grad(ref, (q, k, v), up)):
        assert (got - want).abs().max() <= 1e-12 * max(1.0, want.abs().max().item())  # a zero window: dq = 0
    assert module.last_executor[0] == "band"


def test_pairs_and_block_cover_follow_the_token_window():
    n, left, right = 70, 13, 5
    t = torch.arange(n)
    band = (t[None, :] >= t[:, None] - left) & (t[None, :] <= t[:, None] + right)
    assert window_pairs(n, left, right, False) == int(band.sum())
    assert window_pairs(n, left, right, True) == int((band & (t[None, :] <= t[:, None])).sum())
    blocks = t // 8
    cover = torch.zeros(9, 9, dtype=torch.bool)
    cover[blocks[:, None].expand(n, n)[band], blocks[None, :].expand(n, n)[band]] = True
    assert torch.equal(band_blocks(9, 8, left, right), cover)
    pattern = BlockPattern("sliding_window", 8, window_left=left, window_right=right)
    assert pattern.pairs(n, 4, False) == int(band.sum()) and pattern.label() == "sliding_window(l=13,r=5,b=8)"


def test_window_options_are_refused_where_they_do_not_apply():
    with pytest.raises(ValueError, match="window_left is a token window of pattern='sliding_window'"):
        BlockSparseRingDilatedAttention(pattern="local", window_left=3)
    with pytest.raises(ValueError, match="window_right must be an integer >= 0"):
        _module(3, -1)
    q = torch.randn(1, 16, 2, 8)
    with pytest.raises(ValueError, match="runs on its banded executor"):
        _module(3, 3, executor="flex")(q, q, q)
    with pytest.raises(ValueError, match="without dropout"):
        _module(3, 3, dropout=0.1).train()(q, q, q)
