"""GQA/MQA (kernels/heads.py): k and v with fewer heads than q, query head h attending with kv head
h // (H / H_kv), on every single-device class and the multihead wrappers, against the dense reference."""

import pytest
import torch

from dattn_cli.kernels import DilatedAttention, ImprovedDilatedAttention, dilated_attention_reference
from dattn_cli.kernels.block_sparse.attention import BlockSparseRingDilatedAttention
from dattn_cli.kernels.heads import KVHeadSet, expand_kv, kv_group
from dattn_cli.kernels.multihead import ImprovedMultiheadDilatedAttention, MultiheadDilatedAttention
from dattn_cli.kernels.reference import block_sparse_reference
from tests.conftest import rel_err

SEGS, RATES = [16, 32, 64], [1, 2, 3]


def _inputs(n: int, heads: int, kv_heads: int, batch: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(batch, n, kv_heads, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    return q, k, v, torch.randn(batch, n, heads, 8, generator=g, dtype=torch.float64)


def _grads(out, inputs, upstream):
    return torch.autograd.grad(out, inputs, upstream)


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cls", [DilatedAttention, ImprovedDilatedAttention])
def test_single_device_gqa_equals_the_reference(cls, causal, kv_heads):
    q, k, v, up = _inputs(100, 8, kv_heads)  # ragged: 100 is no multiple of 16, 32 or 64
    mask = torch.zeros(2, 100, dtype=torch.bool)
    mask[1, 90:] = True
    out, lse = cls(SEGS, RATES).forward_with_lse(q, k, v, causal, key_padding_mask=mask)
    ref, ref_lse = dilated_attention_reference(q, k, v, SEGS, RATES, causal, key_padding_mask=mask)
    assert k.shape == (2, 100, kv_heads, 8)
    assert rel_err(out, ref) <= 1e-10 and rel_err(lse, ref_lse) <= 1e-6
    for got, want in zip(_grads(out, (q, k, v), up), _grads(ref, (q, k, v), up)):
        assert got.shape == want.shape and rel_err(got, want) <= 1e-10


def test_reference_uses_kv_head_h_div_group():
    """The reference's convention, checked against an explicit per-head loop of dense attention."""
    q, k, v, _ = _inputs(24, 6, 2, batch=1)
    out, _ = dilated_attention_reference(q, k, v, [24], [1])
    for h in range(6):
        scores = q[0, :, h] @ k[0, :, h // 3].T * 8**-0.5
        assert torch.allclose(out[0, :, h], torch.softmax(scores, -1) @ v[0, :, h // 3])


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_block_sparse_gqa_equals_the_reference(kv_heads):
    module = BlockSparseRingDilatedAttention(pattern="local", block_size=8, window=1, executor="gather")
    q, k, v, up = _inputs(60, 4, kv_heads)
    out, lse = module.forward_with_lse(q, k, v, True)
    ref, ref_lse = block_sparse_reference(q, k, v, module.block_table(60, 4), 8, True)
    assert rel_err(out, ref) <= 1e-10 and rel_err(lse, ref_lse) <= 1e-6
    for got, want in zip(_grads(out, (q, k, v), up), _grads(ref, (q, k, v), up)):
        assert rel_err(got, want) <= 1e-10


def test_kv_heads_that_do_not_divide_the_query_heads_are_refused():
    q = torch.randn(1, 16, 8, 4)
    k = torch.randn(1, 16, 3, 4)
    with pytest.raises(ValueError, match="k and v have 3 heads but q has 8: .* e.g. kv heads in \\[1, 2, 4, 8\\]"):
        ImprovedDilatedAttention([16], [1])(q, k, k)
    with pytest.raises(ValueError, match="k, v equal shapes"):
        ImprovedDilatedAttention([16], [1])(q, k, torch.randn(1, 16, 2, 4))
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads=8"):
        MultiheadDilatedAttention(32, 8, segment_lengths=[16], dilation_rates=[1], num_kv_heads=3)


def test_kv_head_set_packs_one_query_head_per_kv_head():
    # longnet head set of offset 1 at r = 2 over H = 8 with 2 kv heads (g = 4): heads 1, 3, 5, 7 -> kv 0, 0, 1, 1
    heads = KVHeadSet(first=1, step=2, count=4, group=4)
    assert (heads.keep, heads.spread, heads.kv_count) == ([0, 2], [0, 0, 1, 1], 2)
    x = torch.arange(4.0).view(1, 4, 1)
    assert heads.pack(x, 1).flatten().tolist() == [0.0, 2.0]
    assert heads.unpack(heads.pack(x, 1), 1).flatten().tolist() == [0.0, 0.0, 2.0, 2.0]
    assert heads.reduce(x, 1).flatten().tolist() == [1.0, 5.0]  # each kv head's group summed
    assert heads.place(torch.tensor([[[1.0], [5.0]]]), 1).flatten().tolist() == [1.0, 0.0, 5.0, 0.0]
    assert KVHeadSet(0, 3, 3, 2).kv_count == 3  # heads 0, 3, 6 -> kv 0, 1, 3: no two share one
    assert kv_group(8, 2) == 4 and expand_kv(torch.ones(1, 2, 8, 1), torch.ones(1, 2, 8, 1), 8)[0].shape[2] == 8


@pytest.mark.parametrize("cls", [MultiheadDilatedAttention, ImprovedMultiheadDilatedAttention])
def test_multihead_num_kv_heads_projects_kv_heads(cls):
    torch.manual_seed(0)
    mha = cls(32, 8, segment_lengths=[16, 32], dilation_rates=[1, 2], num_kv_heads=2, dtype=torch.float64)
    assert mha.in_proj.weight.shape == (32 + 2 * 2 * 4, 32)
    x = torch.randn(2, 40, 32, dtype=torch.float64, requires_grad=True)
    out, _ = mha(x, x, x, is_causal=True)
    q, k, v = (y.unflatten(-1, (-1, 4)) for y in mha.in_proj(x).split([32, 8, 8], dim=-1))
    ref, _ = dilated_attention_reference(q, k, v, [16, 32], [1, 2], True)
    want = mha.out_proj(mha.norm(ref.flatten(2)))
    assert rel_err(out, want) <= 1e-10
    up = torch.randn_like(out)
    assert rel_err(torch.autograd.grad(out, x, up)[0], torch.autograd.grad(want, x, up)[0]) <= 1e-10
    assert "num_kv_heads=2" in mha.describe()
