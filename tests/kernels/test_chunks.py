"""Sequence chunks (kernels/chunks.py): same result as one call, a working set sized by the chunk."""

import pytest
import torch

from dattn_cli.kernels import DilatedAttention, ImprovedDilatedAttention, reset_global_memory_pool
from dattn_cli.kernels.chunks import chunk_bounds, chunk_length
from dattn_cli.runtime.measure import LiveTensorBytes

SEGS, RATES = [16, 32], [1, 2]


def test_chunk_length_is_a_multiple_of_the_alignment_below_n():
    assert chunk_length(1, 10_000, 2, 8, [16, 48], max_elements=16 * 100) == 96  # 100 positions, down to 2 x lcm 48
    assert chunk_length(1, 100, 2, 8, [16, 48], max_elements=1) == 48  # at least one alignment
    assert chunk_length(1, 48, 2, 8, [16, 48], max_elements=1) is None  # one alignment covers N
    assert chunk_length(1, 10_000, 2, 8, [16, 48], max_elements=None) is None
    assert chunk_bounds(200, 64) == [(0, 64), (64, 128), (128, 192), (192, 200)]


@pytest.mark.parametrize("cls", [ImprovedDilatedAttention, DilatedAttention])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_equals_one_call_and_the_reference(cls, causal, masked):
    """N = 200 in chunks of 64 (a ragged last chunk of 8, shorter than a segment), batch 2, forward and grads."""
    torch.manual_seed(0)
    base = [torch.randn(2, 200, 4, 8, dtype=torch.float64) for _ in range(4)]
    mask = torch.rand(2, 200) < 0.2 if masked else None
    results = []
    for chunk in (None, 2 * 4 * 8 * 64):  # one call; 64 positions per chunk
        module = cls(SEGS, RATES, sequence_chunk_elements=chunk)
        xs = [x.float().requires_grad_() for x in base[:3]]
        out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=mask)
        grads = torch.autograd.grad(out, xs, base[3].float())
        results.append((out, lse, *grads))
    for one, chunked in zip(*results):
        torch.testing.assert_close(chunked, one, rtol=1e-6, atol=1e-6)
    rs = [x.clone().requires_grad_() for x in base[:3]]
    ref, ref_lse = cls(SEGS, RATES).reference(*rs, causal, key_padding_mask=mask)
    ref_grads = torch.autograd.grad(ref, rs, base[3])
    out, lse, *grads = results[1]
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite].double(), rtol=1e-4, atol=1e-4)
    for got, want in [(out, ref), *zip(grads, ref_grads)]:
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_chunks_with_dropout_draw_different_masks():
    """Blocks are numbered from 0 in every chunk: each chunk gets its own seeds, so equal inputs in two chunks do not
    get the same dropout pattern."""
    module = ImprovedDilatedAttention([16], [1], dropout=0.5, backend="math", sequence_chunk_elements=1 * 1 * 4 * 16)
    module.train()
    x = torch.randn(1, 16, 1, 4).repeat(1, 2, 1, 1)  # two identical chunks of 16
    out = module(x, x, x)
    assert not torch.equal(out[:, :16], out[:, 16:])


def _peak(chunk, n=8192):
    reset_global_memory_pool()
    module = ImprovedDilatedAttention([512, 1024], [1, 2], sequence_chunk_elements=chunk)
    with LiveTensorBytes() as tracker:
        q, k, v = (torch.randn(1, n, 4, 32, requires_grad=True) for _ in range(3))
        out = module(q, k, v)
        out.backward(torch.ones_like(out))
    return tracker.peak


@pytest.mark.slow
def test_chunks_bound_the_working_set():
    """Eight chunks of 1024 positions: the peak falls towards the full-size tensors alone (q, k, v, out, lse, dout and
    dq, dk, dv: 8 q-sized tensors), where one call holds its accumulators and block results for all of N."""
    x = 8192 * 4 * 32 * 4
    one, chunked = _peak(None), _peak(1024 * 4 * 32)
    assert chunked < one
    assert chunked < 9.5 * x, (chunked / x, one / x)
