"""The reference against an independent brute-force construction and against plain attention."""

import math

import pytest
import torch

from dattn_cli.kernels.reference import dense_attention, dilated_attention_reference
from tests.conftest import rel_err


def brute_force(q, k, v, segs, rates, causal, semantics, scale=None, key_padding_mask=None):
    """Python loops straight from docs/semantics.md, float64; no shared code with the reference."""
    B, N, H, D = q.shape
    tau = D**-0.5 if scale is None else scale
    m = len(segs)
    sizes = [H // m + (1 if i < H % m else 0) for i in range(m)]
    group_of = [i for i, s in enumerate(sizes) for _ in range(s)]
    out = torch.zeros(B, N, H, D, dtype=torch.float64)
    lse = torch.full((B, N, H), -math.inf, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            if semantics == "longnet":
                used = [(segs[i], rates[i], h % rates[i]) for i in range(m)]
            else:
                g = group_of[h]
                used = [(segs[g], rates[g], g % rates[g])]
            for t in range(N):
                weights = []
                for u in range(N):
                    if causal and u > t:
                        continue
                    if key_padding_mask is not None and key_padding_mask[b, u]:
                        continue
                    c = 0
                    for w, r, o in used:
                        wh = min(w, N)
                        if t // wh == u // wh and (t % wh) % r == o and (u % wh) % r == o:
                            c += 1
                    if c:
                        s = tau * float(q[b, t, h].double() @ k[b, u, h].double())
                        weights.append((u, c, s))
                if not weights:
                    continue
                mx = max(s for _, _, s in weights)
                z = sum(c * math.exp(s - mx) for _, c, s in weights)
                for u, c, s in weights:
                    out[b, t, h] += c * math.exp(s - mx) / z * v[b, u, h].double()
                lse[b, t, h] = mx + math.log(z)
    return out, lse


CASES = [
    # (B, N, H, segs, rates)
    (1, 12, 3, [4, 8], [1, 2]),  # ragged tail on pair 2
    (2, 10, 2, [4, 16], [2, 3]),  # w > N, w % r != 0, no r = 1 (uncovered rows)
    (1, 11, 5, [3, 6, 12], [1, 2, 4]),  # H % m != 0, H % r != 0
]


@pytest.mark.parametrize("semantics", ["longnet", "head_groups"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,N,H,segs,rates", CASES)
def test_reference_matches_brute_force(B, N, H, segs, rates, causal, semantics):
    q, k, v = (torch.randn(B, N, H, 4, dtype=torch.float64) for _ in range(3))
    out, lse = dilated_attention_reference(q, k, v, segs, rates, causal, semantics)
    bo, bl = brute_force(q, k, v, segs, rates, causal, semantics)
    assert rel_err(out, bo) < 1e-12
    assert rel_err(lse, bl) < 1e-6  # reference returns lse as float32


def test_reference_key_padding_and_scale_match_brute_force():
    q, k, v = (torch.randn(2, 9, 2, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 3:] = True
    mask[1, :] = True  # every key padded: rows output 0, lse -inf
    out, lse = dilated_attention_reference(q, k, v, [3, 9], [1, 2], True, scale=0.37, key_padding_mask=mask)
    bo, bl = brute_force(q, k, v, [3, 9], [1, 2], True, "longnet", scale=0.37, key_padding_mask=mask)
    assert rel_err(out, bo) < 1e-12 and rel_err(lse, bl) < 1e-6
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("segs", [[32], [64], [1000]])
def test_dense_pattern_equals_plain_softmax(segs, causal):
    q, k, v = (torch.randn(2, 32, 3, 8, dtype=torch.float64) for _ in range(3))
    out, _ = dilated_attention_reference(q, k, v, segs, [1], causal)
    assert rel_err(out, dense_attention(q, k, v, causal)) < 1e-12


def test_same_pair_twice_is_plain_softmax():
    # c = 2 everywhere: a constant count cancels in the softmax
    q, k, v = (torch.randn(1, 16, 2, 8, dtype=torch.float64) for _ in range(3))
    out, _ = dilated_attention_reference(q, k, v, [16, 16], [1, 1])
    assert rel_err(out, dense_attention(q, k, v)) < 1e-12


def test_chunking_changes_nothing_and_bounds_the_block():
    q, k, v = (torch.randn(2, 40, 3, 8) for _ in range(3))
    full, full_lse = dilated_attention_reference(q, k, v, [8, 16], [1, 2], True)
    small, small_lse = dilated_attention_reference(q, k, v, [8, 16], [1, 2], True, max_block_elements=2 * 3 * 40)
    assert torch.equal(full, small) or rel_err(small, full) < 1e-12
    assert rel_err(small_lse, full_lse) < 1e-7


def test_uncovered_rows_are_zero_and_gradients_finite():
    q, k, v = (torch.randn(1, 12, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse = dilated_attention_reference(q, k, v, [6], [2])  # head 0 keeps even positions only
    assert torch.all(out[0, 1::2, 0] == 0) and torch.all(torch.isneginf(lse[0, 1::2, 0]))
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_reference_dtypes():
    q, k, v = (torch.randn(1, 8, 2, 4, dtype=torch.bfloat16) for _ in range(3))
    out, lse = dilated_attention_reference(q, k, v, [4], [1])
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and lse.shape == (1, 8, 2)
