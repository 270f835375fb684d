"""Packed documents on one device (kernels/documents.py): cu_seqlens gives the same output and gradients as a
separate call on each document, for the dilated, block-sparse and multihead modules (rotary positions counted
from each document's start); bad cu_seqlens are refused with the fix."""

import pytest
import torch

from dattn_cli.kernels import BlockSparseRingDilatedAttention, DilatedAttention, ImprovedDilatedAttention
from dattn_cli.kernels.documents import offsets
from dattn_cli.kernels.multihead import ImprovedMultiheadDilatedAttention
from tests.conftest import rel_err

LENGTHS = [7, 100, 1, 300, 57]
SEGS, RATES = [8, 48, 96], [1, 2, 3]


def _separate(call, tensors, lengths):
    parts, at = [], 0
    for n in lengths:
        parts.append(call(*(x[:, at : at + n] for x in tensors)))
        at += n
    return torch.cat(parts, 1)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "make",
    [
        lambda: ImprovedDilatedAttention(SEGS, RATES),
        lambda: DilatedAttention(SEGS, RATES),
        lambda: BlockSparseRingDilatedAttention(
            pattern="dilated", segment_lengths=SEGS, dilation_rates=RATES, block_size=8
        ),
    ],
)
def test_documents_equal_separate_calls(make, causal):
    module, g = make(), torch.Generator().manual_seed(3)
    q = torch.randn(1, sum(LENGTHS), 8, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, sum(LENGTHS), 2, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = module(q, k, v, causal, cu_seqlens=offsets(LENGTHS))
    separate = _separate(lambda *x: module(*x, causal), (q, k, v), LENGTHS)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64)
    assert rel_err(out, separate) <= 1e-12
    for got, want in zip(torch.autograd.grad(out, (q, k, v), up), torch.autograd.grad(separate, (q, k, v), up)):
        assert rel_err(got, want) <= 1e-12
    ref, _ = module.reference(q, k, v, causal, cu_seqlens=offsets(LENGTHS))
    assert rel_err(out, ref) <= 1e-10  # and the reference per document agrees


def test_multihead_documents_restart_rotary_positions():
    torch.manual_seed(0)
    mha = ImprovedMultiheadDilatedAttention(
        32, 4, segment_lengths=SEGS, dilation_rates=RATES, rotary=True, num_kv_heads=2, dtype=torch.float64
    )
    x = torch.randn(1, sum(LENGTHS), 32, dtype=torch.float64, requires_grad=True)
    out, _ = mha(x, x, x, is_causal=True, cu_seqlens=offsets(LENGTHS))
    separate = _separate(lambda y: mha(y, y, y, is_causal=True)[0], (x,), LENGTHS)
    assert rel_err(out, separate) <= 1e-12
    up = torch.randn_like(out)
    assert rel_err(torch.autograd.grad(out, x, up)[0], torch.autograd.grad(separate, x, up)[0]) <= 1e-12


def test_bad_cu_seqlens_are_refused_with_the_fix():
    module, q = ImprovedDilatedAttention([16], [1]), torch.randn(1, 20, 2, 8)
    for cu, message in (
        (torch.tensor([0, 5, 19]), "end at the sequence length 20"),
        (torch.tensor([0.0, 20.0]), "1-D integer tensor"),
        (torch.tensor([0, 12, 8, 20]), "non-decreasing"),
    ):
        with pytest.raises(ValueError, match=message):
            module(q, q, q, cu_seqlens=cu)
    with pytest.raises(ValueError, match="shape \\(1, T, H, D\\), got batch 2"):
        module(torch.randn(2, 20, 2, 8), *[torch.randn(2, 20, 2, 8)] * 2, cu_seqlens=torch.tensor([0, 20]))
